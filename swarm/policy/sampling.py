"""Token sampling whose logprobs are those of the distribution actually sampled from.

:func:`processed_logprobs` turns raw logits into the log-probabilities the sampler uses:
``log_softmax(logits / temperature)``, then, when ``top_p < 1``, restricted to the nucleus and
renormalised. A trainer that wants importance ratios against recorded logprobs must score its
own logits with the same function (same temperature and top_p). ``temperature == 0`` means
greedy decoding; its recorded logprob is that of the *unscaled* softmax (temperature 1, no
top-p), since a point mass would give 0 for every token and carry no information.

Pure functions over tensors; no model, no batching, no state.
"""

from __future__ import annotations

import torch

__all__ = ["processed_logprobs", "sample_from"]


def processed_logprobs(logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    """Log-probabilities (float32, same shape as ``logits``) of the sampling distribution."""
    logits = logits.float()
    if temperature <= 0:
        return torch.log_softmax(logits, dim=-1)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_logp.exp()
    # Drop a token when the mass strictly before it already reaches top_p; the top token always stays.
    drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def sample_from(logp: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    """One token id from a 1-D row of :func:`processed_logprobs` (argmax when temperature is 0)."""
    if temperature <= 0:
        return int(torch.argmax(logp).item())
    return int(torch.multinomial(logp.exp(), 1, generator=generator).item())
