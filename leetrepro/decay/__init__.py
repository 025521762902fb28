"""The operator's decay rules, one module each: what every layer asks of a rule (its checks, its
normalised form, its mask and the pieces of it the methods need).

* :mod:`.per_head`: ``gamma``, the per-step decay factor λ of Eq. (4), one per head in (0, 1]
  (``None``: the plain 0-1 causal mask), M[i, j] = λ^(i-j).
* :mod:`.per_token`: ``g``, the per-token log gates of simple GLA and Mamba-2 (log a_t per row
  and head, ≤ 0), M[i, j] = exp(G_i − G_j) with G their running sum; a per-head λ as well folds
  into them.
* :mod:`.trapezoid`: Mamba-3's trapezoidal rule, the per-token gates with each key weighted by
  two rows' step sizes and the queries and keys rotated by running angles, folded into the
  operator with gates.
"""
