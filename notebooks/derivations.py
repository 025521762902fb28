# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Derivations, checked numerically
# FleetAttention's identity and Eq. (5), the λ-cumsum of Appendix C.1, the complexity table, the companion paper's Theorem 4.1, and Mamba-3's trapezoidal rule as the gated operator with its angles' gradient as a sum over straddling pairs.

# %% tags=["parameters"]
n = 96
r = 8
d = 16
gamma = 0.9
table_N = 8192
sizes = [16, 32, 64, 128, 256, 512, 1024]   # for the triangular-truncation norm
seed = 0
out_root = None     # where tables and figures go; None: scratch/ of the checkout (make: RESULTS)

# %%
import os
import numpy as np
import pandas as pd
import torch
from IPython.display import Markdown, display
from leetrepro import reference, complexity
from leetrepro.decay.per_head import causal_mask, discounted_cumsum
torch.manual_seed(seed)
from leetrepro.reproduce.tables import output_root
out_root = output_root(out_root)
fig_dir = os.path.join(out_root, "figures", "derivations"); os.makedirs(fig_dir, exist_ok=True)
B, C, V = torch.randn(n, r, dtype=torch.float64), torch.randn(n, r, dtype=torch.float64), torch.randn(n, d, dtype=torch.float64)
lg = torch.log(torch.tensor([gamma], dtype=torch.float64)).view(1, 1, 1)
M = causal_mask(n, lg, dtype=torch.float64, device="cpu")[0]
checks = {}
b, c = B[:, 0], C[:, 0]
checks["(b cᵀ ⊙ M) V = diag(b) M diag(c) V"] = ((torch.outer(b, c) * M) @ V - torch.diag(b) @ M @ torch.diag(c) @ V).abs().max().item()
eq5 = sum(B[:, i:i + 1] * torch.cumsum(C[:, i:i + 1] * V, 0) for i in range(r))
M01 = torch.tril(torch.ones(n, n, dtype=torch.float64))
checks["Eq. (5): Σ diag(b_i) cumsum(diag(c_i) V) = (B Cᵀ ⊙ M₀₁) V"] = (eq5 - (B @ C.T * M01) @ V).abs().max().item()
checks["λ-cumsum(X) = M_λ X  (O_i = X_i + λ O_{i-1})"] = (discounted_cumsum(V[None, None], lg)[0, 0] - M @ V).abs().max().item()
eq5d = sum(B[:, i:i + 1] * discounted_cumsum((C[:, i:i + 1] * V)[None, None], lg)[0, 0] for i in range(r))
checks["App. C.1: Σ diag(b_i) λ-cumsum(diag(c_i) V) = (B Cᵀ ⊙ M_λ) V"] = (eq5d - reference(B[None, None], C[None, None], V[None, None], gamma)[0, 0]).abs().max().item()
table = pd.Series(checks, name="max |difference|").to_frame()
# each identity compares two independent computations: a wrong formula fails here
table["holds (≤ 1e-10)"] = table["max |difference|"] <= 1e-10
assert table["holds (≤ 1e-10)"].all(), table
table

# %%
display(Markdown(f"Complexity at N = {table_N}, r = d = 128 (flops per head):"))
complexity.table(table_N)

# %%
# Theorem 4.1 (FleetAttention paper): masking cannot enlarge an approximation error in Frobenius
# norm, and in operator norm by at most L_n = O(log n) (triangular truncation, Bhatia 2000).
rows = []
for m in sizes:
    A = torch.randn(m, m, dtype=torch.float64)
    U, S, Vh = torch.linalg.svd(A)
    At = U[:, :m // 4] @ torch.diag(S[:m // 4]) @ Vh[:m // 4]          # rank-m/4 approximation
    Mm = torch.tril(torch.ones(m, m, dtype=torch.float64))
    E = A - At
    idx = torch.arange(m, dtype=torch.float64)
    H = 1.0 / (idx[:, None] - idx[None, :] + 0.5)                        # a matrix near the worst case
    rows.append(dict(n=m, frob_masked=(Mm * E).norm().item(), frob_full=E.norm().item(),
                     op_ratio_random=torch.linalg.matrix_norm(Mm * E, 2).item() / torch.linalg.matrix_norm(E, 2).item(),
                     op_ratio_hilbert=torch.linalg.matrix_norm(Mm * H, 2).item() / torch.linalg.matrix_norm(H, 2).item()))
thm = pd.DataFrame(rows)
# The Frobenius part holds by construction (masking only removes entries): shown, not a check.
# What can fail: the operator-norm ratio never exceeds the dyadic bound log2(n) + 1 (the lower
# triangle is a sum of log2(n) + 1 block-diagonal pieces of norm ≤ 1), and on the Hilbert-type
# matrix it grows like (1/π)·ln n (Bhatia 2000), neither bounded nor faster
thm["dyadic bound log2 n + 1"] = np.log2(thm.n) + 1
thm["within the bound"] = (thm.op_ratio_hilbert <= thm["dyadic bound log2 n + 1"]) & \
    (thm.op_ratio_random <= thm["dyadic bound log2 n + 1"])
slope = np.polyfit(np.log(thm.n), thm.op_ratio_hilbert, 1)[0]
assert thm["within the bound"].all(), thm
assert 0.5 / np.pi <= slope <= 2 / np.pi, f"log-growth slope {slope:.3f}, (1/π) = {1 / np.pi:.3f}"
display(Markdown(f"Operator-norm ratio on the Hilbert-type matrix grows like **{slope:.3f}·ln n** "
                 f"(Bhatia: ~ (1/π) ln n = {1/np.pi:.3f}·ln n; checked within a factor 2), and "
                 f"stays under log2(n) + 1 for every n; the Frobenius ratio is ≤ 1 by construction."))
thm

# %%
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(thm.n, thm.op_ratio_hilbert, marker="o", label="‖M⊙H‖₂ / ‖H‖₂ (Hilbert-type)")
ax.plot(thm.n, thm.op_ratio_random, marker="s", label="‖M⊙E‖₂ / ‖E‖₂ (random error)")
ax.set(xscale="log", xlabel="n", ylabel="norm ratio", title="Theorem 4.1: triangular truncation grows like log n")
ax.legend(fontsize=8); ax.grid(alpha=0.3); fig.tight_layout()
for ext in ("png", "svg"):
    fig.savefig(os.path.join(fig_dir, f"theorem41.{ext}"), dpi=120)

# %% [markdown]
# ## The backward pass: three operators of the same family
# With $O = (B C^\top \odot M) V$ and a loss gradient $dO$:
# $\partial L/\partial V = (B C^\top \odot M)^\top dO = (C B^\top \odot M^\top)\, dO$,
# $\partial L/\partial C = \big((dO\, V^\top) \odot M\big)^\top B = (V\, dO^\top \odot M^\top) B$,
# $\partial L/\partial B = (dO\, V^\top \odot M)\, C$.
# $M^\top$ is the causal mask read backwards in time ($M^\top = J M J$ with $J$ the reversal), so
# $dV = J\,\mathrm{op}(JC, JB, J\,dO)$ and $dC = J\,\mathrm{op}(JV, J\,dO, JB)$: each gradient is the
# forward operator on other inputs, and dV's recurrent state $\sum_{s\ge t}\lambda^{s-t} b_s^\top dO_s$
# is the transpose of dC's. Checked below against float64 autograd through the oracle (each check
# can fail: it compares two independent computations).

# %%
gen = torch.Generator().manual_seed(seed + 7)
Bq, Cq, Vq = (torch.randn(2, 3, n, k, dtype=torch.float64, generator=gen, requires_grad=True)
              for k in (r, r, d))
dO = torch.randn(2, 3, n, d, dtype=torch.float64, generator=gen)
auto_grads = torch.autograd.grad((reference(Bq, Cq, Vq, gamma) * dO).sum(), (Bq, Cq, Vq))
J = lambda t: t.flip(2)
formula = {"dB": reference(dO, Vq, Cq, gamma),
           "dV": J(reference(J(Cq), J(Bq), J(dO), gamma)),
           "dC": J(reference(J(Vq), J(dO), J(Bq), gamma))}
back = pd.DataFrame([dict(gradient=k, rel_error=((formula[k] - a).norm() / a.norm()).item())
                     for k, a in zip(("dB", "dC", "dV"), auto_grads)])
assert (back.rel_error < 1e-12).all(), back
back

# %% [markdown]
# ## The gates' gradient from the pieces the backward's sweeps hold
# With per-token log gates $g$ and $G$ their running sum, $M_{ij} = e^{G_i - G_j}$ ($i \ge j$),
# $\partial L/\partial g_t = \sum_{j < t \le i} P_{ij}$ with $P_{ij} = M_{ij}\,(b_i \cdot c_j)(dO_i \cdot v_j)$:
# the pairs that straddle row $t$ (an initial state is a column before the first row, $dS_N$ a
# row after the last). Cut the rows into chunks $[s, e)$; for $t$ in a chunk the pairs fall in four
# kinds:
#
# * **I**, both in the chunk: $\sum_{i \in [t, e)} \sum_{j \in [s, t)} P_{ij}$, from the chunk's own pair tile;
# * **II**, $j$ before the chunk: $\sum_{i \in [t, e)} e_i$ with $e_i = e^{G_i - G_{s-1}} (b_i F_s) \cdot dO_i$,
#   $F_s$ the forward state entering the chunk (what a forward-time sweep carries);
# * **III**, $i$ after the chunk: $\sum_{j \in [s, t)} f_j$ with $f_j = e^{G_{e-1} - G_j} (c_j R_e) \cdot v_j$,
#   $R_e$ the backward state $\sum_{i \ge e} e^{G_i - G_{e-1}} b_i^\top dO_i$ (+ $dS_N$) leaving it (what a
#   reverse-time sweep carries);
# * **IV**, $j$ before and $i$ after: one number per chunk, $K_c$. With $T_b = \sum_{j < b \le i} P_{ij}$ the
#   pairs straddling a boundary, $T_s = E_c + K_c$ and $T_e = K_c + F'_c$ ($E_c = \sum e_i$, $F'_c = \sum f_j$),
#   so $K_c = T_e - F'_c$ and $T_s = T_e - F'_c + E_c$ from $T_N = \langle dS_N, S_N\rangle$: a recursion over
#   chunks, O(chunks) numbers per lane, no state kept.
#
# So a forward sweep gives I + II and $E_c$, a reverse sweep III and $F'_c$ and runs the recursion
# as it goes: no separate kernel and no stored state. Checked below against float64 autograd
# through the oracle, with an initial state, a final state's gradient and a hard reset.

# %%
def dg_by_chunks(B, C, V, dO, g, S0, dSN, L, operand=None, weighted=None, scores=None):
    """∂L/∂g of one lane by the four kinds of pairs above (float64, chunks of L rows).
    ``operand``, ``weighted``: what a kernel's dot does to the state as its operand and to the
    weighted rows entering the state (a rounding; None: nothing), the sweeps' only roundings
    beyond their inputs'. ``scores``: the chunk's own pairs not from the pair tile but from row
    dots of the sweeps' outputs, whose masked scores are rounded so before their product (the
    dB sweep's rows, b_i · dB_i, from dO vᵀ; the dV sweep's columns, v_j · dV_j, from c bᵀ)."""
    operand = operand or (lambda x: x)
    weighted = weighted or (lambda x: x)
    N = B.shape[0]
    G = torch.cumsum(g, 0)
    Gm = lambda k: G[k] if k >= 0 else G.new_zeros(())                  # G_(-1) = 0
    bounds = [(s, min(s + L, N)) for s in range(0, N, L)]
    F, part, E = S0.clone(), torch.zeros(N, dtype=G.dtype), []
    for s, e in bounds:                                                 # forward: I, II, E_c
        rows = torch.arange(s, e)
        W = torch.exp(G[rows, None] - G[None, rows]) * (rows[:, None] >= rows[None, :])
        bc, dv = B[s:e] @ C[s:e].T, dO[s:e] @ V[s:e].T
        P = W * bc * dv
        if scores is not None:  # (rows' pairs less columns' pairs, each from its own rounding)
            rows_less_cols = (scores(W * dv) * bc).sum(1) - (scores(W * bc) * dv).sum(0)
        ei = torch.exp(G[s:e] - Gm(s - 1)) * ((B[s:e] @ operand(F)) * dO[s:e]).sum(-1)
        for t in range(s, e):
            k = t - s
            own = P[k:, :k].sum() if scores is None else rows_less_cols[k:].sum()
            part[t] = own + ei[k:].sum()
        E.append(ei.sum())
        F = torch.exp(Gm(e - 1) - Gm(s - 1)) * F + weighted(C[s:e] * torch.exp(Gm(e - 1) - G[s:e])[:, None]).T @ V[s:e]
    T = (dSN * F).sum()                                                 # T_N = <dS_N, S_N>
    R, dg = dSN.clone(), part.clone()
    for c in range(len(bounds) - 1, -1, -1):                            # reverse: III, F'_c, K_c
        s, e = bounds[c]
        fj = torch.exp(Gm(e - 1) - G[s:e]) * ((C[s:e] @ operand(R)) * V[s:e]).sum(-1)
        K = T - fj.sum()
        for t in range(s, e):
            dg[t] += fj[:t - s].sum() + K
        T = K + E[c]
        R = torch.exp(Gm(e - 1) - Gm(s - 1)) * R + weighted(B[s:e] * torch.exp(G[s:e] - Gm(s - 1))[:, None]).T @ dO[s:e]
    return dg


gen = torch.Generator().manual_seed(seed + 11)
Bg, Cg, Vg, dOg = (torch.randn(n, k, dtype=torch.float64, generator=gen) for k in (r, r, d, d))
S0g, dSNg = (torch.randn(r, d, dtype=torch.float64, generator=gen) for _ in range(2))
gg = torch.nn.functional.logsigmoid(torch.randn(n, dtype=torch.float64, generator=gen) + 2)
gg[n // 3] = -1e4                                                       # a hard reset
gl = gg.clone().requires_grad_()
o, sn = reference(Bg[None, None], Cg[None, None], Vg[None, None], g=gl[None, None],
                  initial_state=S0g[None, None], output_final_state=True)
(auto_dg,) = torch.autograd.grad((o[0, 0] * dOg).sum() + (sn[0, 0] * dSNg).sum(), gl)
pairs = pd.DataFrame([dict(chunk=L, rel_error=((dg_by_chunks(Bg, Cg, Vg, dOg, gg, S0g, dSNg, L)
                                                - auto_dg).norm() / auto_dg.norm()).item())
                      for L in (1, 7, 16, n)])
assert (pairs.rel_error < 1e-12).all(), pairs
pairs

# %% [markdown]
# The running sum over the chunks telescopes: $K_c$ is right only while the totals $E_c$, $F'_c$
# come from states that agree with each other to the sum's last bit. With 16-bit operands the
# kernels round the state where it is a dot operand and its update's weighted rows as they enter
# it (each about $2^{-9}$ of them in bf16), and $K_c$ then carries $\sqrt{\text{chunks}}$ of
# that. So the 16-bit sweeps that carry the pieces take each of those two products twice, the
# second with the rounding's remainder, and their states are fp32's. The straddle kernel has
# no running sum: the pairs straddling a row $s$ are $T_s = \langle F_s e^{g_s}, R_s \rangle$,
# with $F_s$ the forward state entering row $s$ and
# $R_s = \sum_{i \ge s} e^{G_i - G_s} b_i^\top dO_i$ the reverse state from it on (with the
# initial state and the final state's gradient in them). Checked below: $T_s$ from the two
# states equals the pairs straddling $s$ summed directly.

# %%
Gs = torch.cumsum(gg, 0)
P = torch.exp(torch.tril(Gs[:, None] - Gs[None, :])) * torch.tril(torch.ones(n, n)) * \
    (Bg @ Cg.T) * (dOg @ Vg.T)                                          # P_ij, i ≥ j
rows_s = [s for s in (n // 4, n // 2, 3 * n // 4) if s != n // 3 and s != n // 3 + 1]
check = []
for s in rows_s:
    F = torch.exp(Gs[s - 1]) * S0g + (Cg[:s] * torch.exp(Gs[s - 1] - Gs[:s])[:, None]).T @ Vg[:s]
    R = torch.exp(Gs[n - 1] - Gs[s]) * dSNg + (Bg[s:] * torch.exp(Gs[s:] - Gs[s])[:, None]).T @ dOg[s:]
    direct = P[s:, :s].sum() + (torch.exp(Gs[s:])[:, None] * (Bg[s:] @ S0g) * dOg[s:]).sum() + \
        (dSNg * ((Cg[:s] * torch.exp(Gs[n - 1] - Gs[:s])[:, None]).T @ Vg[:s])).sum() + \
        torch.exp(Gs[n - 1]) * (S0g * dSNg).sum()
    check.append(dict(row=s, T_from_states=(F * torch.exp(gg[s]) * R).sum().item(),
                      T_summed=direct.item()))
check = pd.DataFrame(check)
assert ((check.T_from_states - check.T_summed).abs() <= 1e-9 * check.T_summed.abs().max()).all(), check
check

# %% [markdown]
# What each rounding costs, with bf16 inputs (B, C, V, dO and the initial state rounded to bf16)
# over 64 chunks of 64 rows (r = d = 64): dg from the float64 answer of the unrounded inputs, the pieces as
# above with the state rounded to bf16 where it is a dot operand, its update's weighted rows
# rounded to bf16, both, and both taken back by a second product of each rounding's remainder
# (a hi and a lo bf16 operand, what the 16-bit sweeps do). "inputs" is the floor: the float64
# answer of the rounded inputs, what any kernel inherits.

# %%
bf16 = lambda x: x.to(torch.bfloat16).to(torch.float64)
split = lambda x: bf16(x) + bf16(x - bf16(x))
gen = torch.Generator().manual_seed(seed + 13)
Nr, Lr, rr = 4096, 64, 64
Br, Cr = (torch.randn(Nr, rr, dtype=torch.float64, generator=gen) / rr ** 0.5 for _ in range(2))
Vr, dOr = (torch.randn(Nr, rr, dtype=torch.float64, generator=gen) for _ in range(2))
S0r, dSr = (torch.randn(rr, rr, dtype=torch.float64, generator=gen) for _ in range(2))
gr = torch.nn.functional.logsigmoid(2 * torch.randn(Nr, dtype=torch.float64, generator=gen))
exact = dg_by_chunks(Br, Cr, Vr, dOr, gr, S0r, dSr, Lr)
rounded = [bf16(x) for x in (Br, Cr, Vr, dOr)]
rel = lambda x: ((x - exact).norm() / exact.norm()).item()
cases = {"inputs": (None, None), "state operand": (bf16, None), "weighted rows": (None, bf16),
         "both": (bf16, bf16), "both, remainders taken back": (split, split)}
by_case = {name: dg_by_chunks(*rounded, gr, bf16(S0r), dSr, Lr, *ops) for name, ops in cases.items()}
rounding = pd.DataFrame([dict(rounded=name, dg_rel_error=rel(x)) for name, x in by_case.items()])
floor = rounding.dg_rel_error[0]
assert (rounding.dg_rel_error[1:4] > 1.5 * floor).all() and rounding.dg_rel_error[4] < 1.05 * floor, rounding
rounding

# %% [markdown]
# fp16 has three more mantissa bits than bf16: could the state operand and the weighted rows be
# rounded to fp16 instead, with no remainders (two products a chunk fewer)? dg alone would stay
# within the contract (1e-2), but a parameter that sums dg over the rows would not: Mamba-2's
# A takes $dA = \sum_t dg_t\,dt_t$, a sum that cancels what dg's terms do not. Same inputs, dt =
# softplus(x − 2):

# %%
f16 = lambda x: x.to(torch.float16).to(torch.float64)
dtr = torch.nn.functional.softplus(torch.randn(Nr, dtype=torch.float64, generator=gen) - 2)
sums = lambda x: abs(((x - exact) * dtr).sum() / (exact * dtr).sum()).item()
fp16_rows = {"remainders taken back": by_case["both, remainders taken back"],
             "fp16": dg_by_chunks(*rounded, gr, bf16(S0r), dSr, Lr, f16, f16)}
fp16_table = pd.DataFrame([dict(rounded=name, dg_rel_error=rel(x), dA_rel_error=sums(x))
                           for name, x in fp16_rows.items()])
assert fp16_table.dg_rel_error[1] < 1e-2 < fp16_table.dA_rel_error[1] and \
    fp16_table.dA_rel_error[0] < 1e-2, fp16_table
fp16_table

# %% [markdown]
# Nor can the chunk's own pairs skip the pair tile's product. A row's pairs with the columns
# before it are $b_i \cdot dB_i$ and a column's with the rows after it $v_j \cdot dV_j$, row dots of
# outputs the sweeps make anyway; their difference, summed from a row to the chunk's end, is the
# pairs straddling it. But each output's intra-chunk part comes from its masked scores rounded to
# 16 bits before their product, the rows' from $dO\,v^\top$ and the columns' from $c\,b^\top$, and
# the pairs with both ends past $t$ then cancel between two different roundings. Same inputs,
# the remainders taken back as the kernels do, against float64 of the same rounded inputs:

# %%
same_inputs = by_case["inputs"]                                    # float64 of the rounded inputs
row_dots_table = pd.DataFrame([
    dict(own_pairs=name, dg_rel_error=((x - same_inputs).norm() / same_inputs.norm()).item(),
         dA_rel_error=abs(((x - same_inputs) * dtr).sum() / (same_inputs * dtr).sum()).item())
    for name, x in (("the pair tile (the kernels)", by_case["both, remainders taken back"]),
                    ("row dots of the outputs",
                     dg_by_chunks(*rounded, gr, bf16(S0r), dSr, Lr, split, split, scores=bf16)))])
assert row_dots_table.dg_rel_error[0] < 1e-4 < 1e-2 < row_dots_table.dg_rel_error[1], \
    row_dots_table
row_dots_table

# %% [markdown]
# ## Mamba-3's trapezoidal rule is the operator with per-token gates
# Mamba-3's SISO recurrence (mamba_ssm 2.3) per head, with $\alpha_t = e^{A\,dt_t}$,
# $\lambda_t = \sigma(\text{Trap}_t)$ and $\tilde q_t, \tilde k_t$ the rotated queries and keys:
#
# $$S_t = \alpha_t S_{t-1} + (1-\lambda_t)\,dt_t\,\alpha_t\, v_{t-1}\tilde k_{t-1}^\top + \lambda_t\,dt_t\, v_t \tilde k_t^\top,\qquad y_t = S_t\,\tilde q_t .$$
#
# Key $s$ enters at row $s$ with $\lambda_s dt_s$ and again at row $s+1$ with
# $(1-\lambda_{s+1})dt_{s+1}\alpha_{s+1}$, and $\alpha_{s+1}$ is the decay everything entering at $s$
# meets at $s+1$. So with the gates $g_t = A\,dt_t$ ($M_{ij} = \prod_{j<u\le i}\alpha_u$) the
# recurrence is the operator with the keys weighted by $w_s = \lambda_s dt_s + (1-\lambda_{s+1})dt_{s+1}$
# (the second term 0 at the last row), each row's own pair corrected by
# $-(1-\lambda_{t+1})dt_{t+1}(\tilde q_t\cdot\tilde k_t)v_t$ (at row $t$ only $\lambda_t dt_t$ has
# entered), and the previous call's last key and value in the initial state:
# $S_0' = S_\text{in} + (1-\lambda_0)dt_0\,v_\text{prev}\tilde k_\text{prev}^\top$. The rotation
# by the running angles needs nothing of the operator: $(R_{\theta_t}q)\cdot(R_{\theta_s}k) =
# q^\top R_{\theta_s-\theta_t}k$, so it is applied to q and k before the call. Both identities
# exactly, in sympy (four rows, scalar q, k, v: the algebra is the same per entry of the
# state), then the drop-in against the recurrence in float64.

# %%
import sympy as sp

T = 4
alpha = sp.symbols(f"alpha0:{T}", positive=True)
lam, dts = sp.symbols(f"lambda0:{T}"), sp.symbols(f"dt0:{T}", positive=True)
qs, ks, vs = sp.symbols(f"q0:{T}"), sp.symbols(f"k0:{T}"), sp.symbols(f"v0:{T}")
S_in, k_prev, v_prev = sp.symbols("S_in k_prev v_prev")
S, kp, vp, recurrence = S_in, k_prev, v_prev, []
for t in range(T):
    S = alpha[t] * S + (1 - lam[t]) * dts[t] * alpha[t] * vp * kp + lam[t] * dts[t] * vs[t] * ks[t]
    recurrence.append(S * qs[t])
    kp, vp = ks[t], vs[t]
later = [(1 - lam[t + 1]) * dts[t + 1] if t + 1 < T else 0 for t in range(T)]
w = [lam[s] * dts[s] + later[s] for s in range(T)]
decay = lambda i, j: sp.prod(alpha[j + 1:i + 1])                       # M_ij, i ≥ j
S0 = S_in + (1 - lam[0]) * dts[0] * v_prev * k_prev
operator = [qs[i] * (sum(decay(i, j) * w[j] * ks[j] * vs[j] for j in range(i + 1))
                     + sp.prod(alpha[:i + 1]) * S0) - later[i] * qs[i] * ks[i] * vs[i]
            for i in range(T)]
final = sum(decay(T - 1, j) * w[j] * ks[j] * vs[j] for j in range(T)) + sp.prod(alpha) * S0
assert all(sp.expand(a - b) == 0 for a, b in zip(recurrence, operator))
assert sp.expand(final - S) == 0                                      # S_N: the operator's
th_t, th_s, q0, q1, k0, k1 = sp.symbols("theta_t theta_s q_0 q_1 k_0 k_1", real=True)
rot = lambda th: sp.Matrix([[sp.cos(th), -sp.sin(th)], [sp.sin(th), sp.cos(th)]])
qv, kv = sp.Matrix([q0, q1]), sp.Matrix([k0, k1])
assert sp.simplify((rot(th_t) * qv).dot(rot(th_s) * kv) - qv.dot(rot(th_s - th_t) * kv)) == 0
display(Markdown("Both identities hold exactly (sympy); the drop-in "
                 "(`compat.mamba3_siso_combined`) against the recurrence "
                 "(`reference.mamba3_reference`), a random prompt of n rows with states in:"))

# %%
from leetrepro import rel_error
from leetrepro.compat import mamba3_siso_combined
from leetrepro.reference import mamba3_reference

gen = torch.Generator().manual_seed(seed + 17)
rnd = lambda *s: torch.randn(*s, dtype=torch.float64, generator=gen)
heads3, hqk3 = 4, 2
dt3 = torch.nn.functional.softplus(rnd(1, heads3, n) - 1)
m3 = dict(Q=rnd(1, n, hqk3, r) / r ** 0.5, K=rnd(1, n, hqk3, r) / r ** 0.5, V=rnd(1, n, heads3, d),
          ADT=-dt3 * 0.5, DT=dt3, Trap=rnd(1, heads3, n), Q_bias=rnd(heads3, r) / 3,
          K_bias=rnd(heads3, r) / 3, Angles=rnd(1, n, heads3, r // 2), D=rnd(heads3),
          Z=rnd(1, n, heads3, d))
states3 = (rnd(1, heads3, r // 2), rnd(1, heads3, d, r) / 3, rnd(1, heads3, r) / 3, rnd(1, heads3, d))
m3_rows = []
for dt_ in (torch.float64, torch.float32):
    cast = {k: v.to(dt_) for k, v in m3.items()}
    y3, _, ssm3, _, _ = mamba3_siso_combined(**cast, Input_States=tuple(s.to(dt_) for s in states3),
                                             return_final_states=True)
    want3, fin3 = mamba3_reference(**m3, Input_States=states3)
    m3_rows.append(dict(dtype=str(dt_)[6:], y_rel_error=rel_error(y3.double(), want3),
                        state_rel_error=rel_error(ssm3.double(), fin3[1])))
mamba3_check = pd.DataFrame(m3_rows)
assert (mamba3_check.y_rel_error[0] < 1e-12) and (mamba3_check.y_rel_error[1] < 1e-5), mamba3_check
mamba3_check

# %% [markdown]
# ## Mamba-3's angles' gradient is a sum over the pairs that straddle each row
# With $\tilde q_i = R_{\theta_i}x_i$, $\tilde k_j = R_{\theta_j}y_j$ and $s_{ij} = M_{ij}\,(dO_i\cdot v_j)$,
# each pair $j \le i$ enters the loss through $\tilde q_i\cdot\tilde k_j$, which depends on the
# angles only through $\theta_j - \theta_i$: its part of $d\theta_i$ is minus its part of
# $d\theta_j$. So the suffix sum $\sum_{t\ge s} d\theta_t$ (what the Angles' and dt's gradients
# are made of) keeps only the pairs with $j < s \le i$, and those factor through the states:
# $F_s = \sum_{j<s} e^{G_s-G_j} v_j\tilde k_j^\top$ (the forward state entering row $s$) and
# $R_s = \sum_{i\ge s} e^{G_i-G_s} dO_i\tilde q_i^\top$ (the backward state). With
# $P_s = R_s^\top F_s$ ($r\times r$): the gates' gradient is $\operatorname{tr}P_s$ and angle $a$'s
# suffix sum is $(P_s)_{2a,2a+1} - (P_s)_{2a+1,2a}$, the antisymmetric part of its $2\times2$
# diagonal block. Checked in float64 against autograd, then what each form keeps of float64's
# answer when the operator's gradients of $\tilde q$ and $\tilde k$ come rounded to bf16 (a 16-bit
# operator's), against the states' form in float32 on the same bf16 values.

# %%
def straddle_blocks(q, k, v, dO, g):
    """P_s = R_sᵀ F_s for every row s (N, r, r), from the two states' recurrences."""
    N, r = q.shape
    F = torch.zeros(v.shape[1], r, dtype=q.dtype)
    R = torch.zeros_like(F)
    Fs, Rs = [], [None] * N
    for s in range(N):
        Fs.append(F)
        F = torch.exp(g[s + 1]) * (F + torch.outer(v[s], k[s])) if s + 1 < N else F
    for s in reversed(range(N)):
        R = torch.outer(dO[s], q[s]) + (torch.exp(g[s + 1]) * R if s + 1 < N else 0)
        Rs[s] = R
    return torch.einsum("sdc,sde->sce", torch.stack(Rs), torch.stack(Fs))


def turn(z, th):
    even, odd = z[:, 0::2], z[:, 1::2]
    return torch.stack((even * th.cos() - odd * th.sin(), even * th.sin() + odd * th.cos()), -1) \
        .flatten(1)


def pair_parts(P):
    """(the gates' gradient, each angle's suffix sum) from P (N, r, r)."""
    a = torch.arange(P.shape[1] // 2)
    return P.diagonal(dim1=1, dim2=2).sum(-1), P[:, 2 * a, 2 * a + 1] - P[:, 2 * a + 1, 2 * a]


def angle_case(N, r=16, d=16, seed_=0):
    gen_ = torch.Generator().manual_seed(seed_)
    rnd_ = lambda *s: torch.randn(*s, dtype=torch.float64, generator=gen_)
    x, y, v, dO = rnd_(N, r) / r ** 0.5, rnd_(N, r) / r ** 0.5, rnd_(N, d), rnd_(N, d)
    g = -torch.nn.functional.softplus(rnd_(N) - 3)
    theta = (rnd_(N, r // 2) * 0.3).cumsum(0)
    return x, y, v, dO, g, theta


x, y, v, dO, g, theta = angle_case(n)
th = theta.clone().requires_grad_()
gl = g.clone().requires_grad_()
G = gl.cumsum(0)
q_, k_ = turn(x, th), turn(y, th)
M = torch.tril(torch.exp(G[:, None] - G[None, :]))
loss = (dO * (((q_ @ k_.T) * M) @ v)).sum()
d_theta, d_g = torch.autograd.grad(loss, (th, gl))
dg_states, angles_states = pair_parts(straddle_blocks(q_.detach(), k_.detach(), v, dO, g))
suffix = d_theta.flip(0).cumsum(0).flip(0)
assert torch.allclose(dg_states, d_g, atol=1e-10) and torch.allclose(angles_states, suffix, atol=1e-10)
display(Markdown("Both hold to float64 (the gates' gradient as the trace, each angle's suffix sum "
                 "as its block's antisymmetric part). What each form keeps, bf16 values in:"))

# %%
def quarter(dz, z):
    return dz[:, 1::2] * z[:, 0::2] - dz[:, 0::2] * z[:, 1::2]


bf = lambda t: t.to(torch.bfloat16).double()
angle_rows = []
for N in (256, 1024, 4096):
    x, y, v, dO, g, theta = (bf(t) if i < 4 else t for i, t in enumerate(angle_case(N, seed_=N)))
    q_, k_ = bf(turn(x, theta)), bf(turn(y, theta))
    M = torch.tril(torch.exp(g.cumsum(0)[:, None] - g.cumsum(0)[None, :]))
    Sm = (dO @ v.T) * M
    want = pair_parts(straddle_blocks(q_, k_, v, dO, g))[1]
    dq, dk = bf((Sm @ k_).float()).double(), bf((Sm.T @ q_).float()).double()  # (bf16 outputs)
    rounded = (quarter(dq, q_) + quarter(dk, k_)).flip(0).cumsum(0).flip(0)
    f32 = pair_parts(straddle_blocks(*(t.float() for t in (q_, k_, v, dO, g))))[1].double()
    angle_rows.append(dict(rows=N, suffix_sums_of_bf16_gradients=rel_error(rounded, want),
                           states_in_float32=rel_error(f32, want)))
angle_check = pd.DataFrame(angle_rows)
# (the suffix sums of rounded gradients drift away as the rows grow; the states' form does not)
assert (angle_check.states_in_float32 < 1e-5).all(), angle_check
assert angle_check.suffix_sums_of_bf16_gradients.is_monotonic_increasing, angle_check
angle_check
