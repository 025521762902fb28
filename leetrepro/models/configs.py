"""Published shapes of the two models, with where each number comes from. The paper keeps the
first two layers of each (Appendix A.1), so ``layers`` is 2 here; the rest is the full model's.

TransNormerLLM-7B: ``config.json`` of OpenNLPLab/TransNormerLLM-7B on the Hugging Face Hub
(decoder_embed_dim 4096, decoder_layers 30, decoder_attention_heads 32, glu_dim 11008,
vocab_size 64000, norm_type simplermsnorm, linear_act_fun swish, LRPE on the first layer) and the
block of Qin et al. (2023), *TransNormerLLM*, Sec. 3: gated linear attention
``O = Norm(φ(XW_q) φ(XW_k)ᵀ ⊙ M · XW_v) ⊙ XW_u`` with φ = swish, per-head decay
λ_h = exp(-s_h·(1 - l/(L-1) + 1e-5)) (ALiBi slopes s_h, layer l of L), simple GLU
``[XW_v ⊙ XW_u] W_o``, SRMSNorm pre-norms.

toy-retnet-1.3B (wac81/toy_retnet_1.3b) is built on syncdoth/RetNet; its own config could not be
read here, so the 1.3B configuration of that code base is used (``configs/retnet-1.3b.yml``:
decoder_embed_dim 2048, decoder_layers 24, decoder_retention_heads 8, decoder_ffn_embed_dim 4096,
value_factor 2, activation gelu, subln, layernorm_embedding, vocab 50257), with multi-scale
retention as in Sun et al. (2023): γ_h = 1 - 2^(-5-h), xPos-style rotation of q and k, k scaled
by 1/sqrt(d_k), the decay matrix normalised by the square root of its row sums, scores by their
absolute row sums, a per-head group norm and a swish output gate.
"""
from __future__ import annotations

CONFIGS = {
    "transnormer": dict(name="TransNormerLLM-7B (first 2 layers)", dim=4096, layers=2,
                        total_layers=30, heads=32, glu_dim=11008, vocab=64000, lrpe_layers=(0,),
                        eps=1e-6),
    "retnet": dict(name="toy-retnet-1.3B (first 2 layers)", dim=2048, layers=2, heads=8,
                   value_factor=2, ffn_dim=4096, vocab=50257, eps=1e-6),
}

#: shapes small enough for the CPU (CI runs the notebook with these)
TINY = {
    "transnormer": dict(dim=64, heads=4, glu_dim=96, vocab=100, total_layers=30),
    "retnet": dict(dim=64, heads=2, ffn_dim=96, vocab=100),
}


def config(name: str, tiny: bool = False, **overrides) -> dict:
    if name not in CONFIGS:
        raise ValueError(f"unknown model {name!r}; use one of {sorted(CONFIGS)}")
    return {**CONFIGS[name], **(TINY[name] if tiny else {}), **overrides}
