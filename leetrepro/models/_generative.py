"""What generation needs of a model (:class:`Generative`, mixed into TransNormerLLM and RetNet);
the generation loop itself is :mod:`leetrepro.models.generate`."""
from __future__ import annotations

import torch

from ..ops import state_dtype


class Generative:
    """Mixed into the model classes: ``embed_tokens``, ``layers`` (each with ``mixed``), ``norm``."""

    def hidden(self, input_ids, attend_for, positions=None):
        """Hidden states with layer i's attention computed by ``attend_for(i)``."""
        x = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer.mixed(x, attend_for(i), positions)
        return self.norm(x)

    def state_pools(self, slots: int, device, probe_len: int = 1) -> list[torch.Tensor]:
        """One pool ``(slots, heads, r, d)`` per layer (fp32; fp64 for a float64 model), r and d read
    off a probe."""
        shapes = []

        def attend_for(i):
            def attend(q, k, v, gamma):
                shapes.append(((q.shape[1], q.shape[3], v.shape[3]), state_dtype(v.dtype)))
                return torch.zeros_like(v)
            return attend
        with torch.no_grad():
            self.hidden(torch.zeros(1, probe_len, dtype=torch.long, device=device), attend_for)
        return [torch.zeros(slots, *s, dtype=dt, device=device) for s, dt in shapes]
