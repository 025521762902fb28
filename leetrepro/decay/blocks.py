"""What the PyTorch methods ask of a call's decay, whatever its rule (:class:`Decay`): the whole
mask, a block of rows' mask and the weights that carry a state into the block and out of it, the
block's total decay, and the blocks' states chained. The per-head rule's pieces come from
:mod:`.per_head`, the per-token rule's from :mod:`.per_token`; a method that takes its decay as a
:class:`Decay` never names the rule, so a third rule adds its branch here, not in each method.

Conventions (every method's): the state entering a block of rows s..e-1 reaches its row i with
the decay of rows s..i (λ^(i-s+1), or exp(G_i) with G the gates' running sum from s); row j's
part of the state leaving the block decays by rows j+1..e-1 (λ^(e-1-j), exp(G_(e-1) − G_j)); the
state itself decays across the block by λ^L, or exp(G_(e-1)).
"""
from __future__ import annotations

from typing import Iterator, NamedTuple

import torch

from .per_head import causal_mask, discounted_cumsum, log_gamma, powers
from .per_token import gate_mask, local_cumsum, running_gates


class Block(NamedTuple):
    """One block's (or every block's, with a blocks axis) pieces of the decay."""
    mask: torch.Tensor | None        # (…, L, L): M[i, j] within the block
    into: torch.Tensor | None        # (…, L, 1): the entering state's weight at each row; None: 1
    out_of: torch.Tensor | None      # (…, L, 1): each row's weight in the leaving state; None: 1
    total: torch.Tensor | float | None  # the state's decay across the block, a factor that
    # broadcasts to the state (Decay.blocks); its log in Decay.batched, which Decay.chained reads


def of_blocks(w: torch.Tensor | None, which: slice) -> torch.Tensor | None:
    """The blocks ``which`` (a slice of the blocks axis) of weights ``(…, nb, L, 1)``
    (:meth:`Decay.batched`'s), None where the weights are (the 0-1 mask)."""
    return None if w is None else w[..., which, :, :]


class Decay(NamedTuple):
    """One call's decay as the PyTorch methods compute with it, in their accumulation dtype:
    per-head log λ ``lg`` ``(H, 1, 1)`` (None: the 0-1 mask), or per-token log gates ``g``
    ``(batch, H, N)`` (a γ already folded in, ``lg`` None then)."""
    lg: torch.Tensor | None
    g: torch.Tensor | None = None

    @classmethod
    def of(cls, gamma: torch.Tensor | None, g: torch.Tensor | None,
           dtype: torch.dtype) -> "Decay":
        """A call's decay in ``dtype``: per-head λ ``gamma`` ``(H,)`` (float64, or None), or
        the per-token gates ``g`` (γ folded in)."""
        return cls(log_gamma(gamma, dtype), None if g is None else g.to(dtype))

    def padded(self, n: int) -> "Decay":
        """The decay of the rows padded with zero rows to ``n`` (gates of 0: nothing decays
        there, and zero rows add nothing)."""
        if self.g is None:
            return self
        return self._replace(g=torch.nn.functional.pad(self.g, (0, n - self.g.shape[-1])))

    def mask(self, n: int, *, dtype: torch.dtype, device) -> torch.Tensor:
        """The whole ``(…, N, N)`` mask, from float64 running sums for the gates. O(N²)."""
        if self.g is not None:
            return gate_mask(running_gates(self.g), dtype=dtype)
        return causal_mask(n, self.lg, dtype=dtype, device=device)

    def blocks(self, n: int, size: int, *, dtype: torch.dtype, device) -> Iterator[tuple]:
        """``(s, e, Block)`` for the blocks of ``size`` rows in order (the last may be shorter),
        each computed when reached: O(size²) memory a block. The per-head pieces are made once
        for a full block and sliced."""
        if self.g is not None:
            for s in range(0, n, size):
                e = min(n, s + size)
                G = self.g[:, :, s:e].cumsum(-1)  # (the block's own running sums)
                yield s, e, Block(gate_mask(G, dtype=dtype), torch.exp(G)[..., None],
                                  torch.exp(G[..., -1:] - G)[..., None],
                                  torch.exp(G[..., -1])[..., None, None])
            return
        mask = causal_mask(size, self.lg, dtype=dtype, device=device)
        into = powers(self.lg, size, start=1, dtype=dtype, device=device)
        for s in range(0, n, size):
            e = min(n, s + size)
            ln = e - s
            yield s, e, Block(mask[..., :ln, :ln], None if into is None else into[:, :ln],
                              powers(self.lg, ln, reverse=True, dtype=dtype, device=device),
                              1.0 if self.lg is None else torch.exp(self.lg * ln))

    def batched(self, nb: int, size: int, *, dtype: torch.dtype, device,
                masks: bool = True) -> Block:
        """Every block's pieces at once, a blocks axis before the rows (``nb`` blocks of ``size``
        rows; the gates padded with zeros to ``nb·size``): the mask ``(…, nb or 1, L, L)``, the
        weights ``(…, nb, L, 1)`` (None for the 0-1 mask); ``total`` the gates' sum per block
        ``(batch, H, nb)``, or L·log λ (:meth:`chained` reads it). ``masks`` False: the
        weights alone (mask None), O(N) memory."""
        if self.g is not None:
            G = local_cumsum(self.padded(nb * size).g, size).view(*self.g.shape[:2], nb, size)
            total = G[..., -1]
            return Block(gate_mask(G, dtype=dtype) if masks else None,
                         torch.exp(G).to(dtype)[..., None],
                         torch.exp(total[..., None] - G).to(dtype)[..., None], total)
        def per_block(w):  # (H, L, 1) -> (H, nb, L, 1), a view: sliced by blocks as the gates'
            return None if w is None else w.unsqueeze(1).expand(-1, nb, -1, -1)
        return Block(causal_mask(size, self.lg, dtype=dtype, device=device).unsqueeze(1)
                     if masks else None,
                     per_block(powers(self.lg, size, start=1, dtype=dtype, device=device)),
                     per_block(powers(self.lg, size, reverse=True, dtype=dtype, device=device)),
                     None if self.lg is None else self.lg * size)

    def chained(self, s: torch.Tensor, blocks: Block) -> torch.Tensor:
        """The states entering blocks 1..nb-1, ``(batch, H, nb-1, r, d)``, from each block's own
        state s ``(batch, H, nb-1, r, d)`` (blocks 0..nb-2, :meth:`batched`'s ``out_of``
        weights in them): H_i = total_(i-1)·H_(i-1) + s_(i-1). The per-head rule's by one
        discounted scan over the blocks (O(log) levels), the gates' one block at a time."""
        if self.g is None:
            batch, heads, m, r, d = s.shape
            return discounted_cumsum(s.reshape(batch, heads, m, r * d), blocks.total).view(
                batch, heads, m, r, d)
        out = torch.empty_like(s)
        h = torch.zeros_like(s[:, :, 0])
        for i in range(s.shape[2]):
            h = h * torch.exp(blocks.total[:, :, i]).to(s.dtype)[..., None, None] + s[:, :, i]
            out[:, :, i] = h
        return out

    def state_weights(self) -> tuple:
        """``(lg, G)`` as :func:`leetrepro._state.add_initial_state` and ``final_state`` take
        them: log λ, or the gates' float64 running sums over the whole sequence."""
        return (self.lg, None) if self.g is None else (None, running_gates(self.g))
