"""Policy-gradient losses as pure functions of per-token tensors.

- :func:`ppo_clip_loss`: PPO-clip with asymmetric clip range. The importance ratio is taken
  against the *proximal* logprobs; by default those are the behaviour logprobs recorded by the
  gateway (ratio = pi_theta / mu). Given separate proximal logprobs (decoupled PPO), the
  surrogate is multiplied by the truncated importance weight ``min(pi_prox / mu, tis_cap)``
  (TIS), which corrects train/inference mismatch without letting rare tokens explode.
- :func:`k3_kl`: the k3 estimator of KL(pi_theta || pi_ref), unbiased and non-negative.
- :func:`item_token_weights`: token- or sequence-level aggregation as one weight per token,
  computed over the *whole* batch so that gradient accumulation over micro-batches adds up to
  exactly the full-batch gradient.

Missing behaviour logprobs (NaN) are treated as on-policy: mu = pi_theta, detached.
Losses return per-token values; summing with weights is the caller's one line. No logging here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch

from swarm.errors import ValidationError

__all__ = ["ppo_clip_loss", "k3_kl", "item_token_weights", "LossAgg"]

LossAgg = Literal["token", "sequence"]


def item_token_weights(n_targets: Sequence[int], agg: LossAgg = "token") -> torch.Tensor:
    """Per-item weight of each of its tokens; the weighted sum of token losses is the batch loss.

    ``token``: every token of the batch counts equally (1 / all tokens).
    ``sequence``: every item counts equally, its tokens averaged (1 / (items * its tokens)).
    Items with no targets get weight 0 and do not count as items.
    """
    n = torch.tensor([float(x) for x in n_targets], dtype=torch.float64)
    if agg == "token":
        total = n.sum()
        return torch.where(n > 0, 1.0 / total.clamp(min=1.0), torch.zeros_like(n))
    if agg == "sequence":
        items = (n > 0).sum().clamp(min=1)
        return torch.where(n > 0, 1.0 / (items * n.clamp(min=1.0)), torch.zeros_like(n))
    raise ValidationError(f"loss aggregation must be 'token' or 'sequence', got {agg!r}")


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def ppo_clip_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    proximal_logp: torch.Tensor | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO-clip loss (to minimise) and per-token diagnostics (detached).

    Diagnostics: ``ratio``, ``clipped`` (1.0 where the clipped branch is active, i.e. no
    gradient), ``approx_kl`` (k3 of the current policy against mu), ``tis_weight``.
    """
    if not (logp.shape == behaviour_logp.shape == advantages.shape):
        raise ValidationError(
            f"logp {tuple(logp.shape)}, behaviour {tuple(behaviour_logp.shape)} and advantages "
            f"{tuple(advantages.shape)} must have the same shape"
        )
    behaviour = torch.where(torch.isnan(behaviour_logp), logp.detach(), behaviour_logp)
    prox = behaviour if proximal_logp is None else proximal_logp.detach()
    ratio = torch.exp(logp - prox)
    surr1 = ratio * advantages
    surr2 = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(surr1, surr2)
    if tis_cap is not None and proximal_logp is not None:
        tis = torch.exp(prox - behaviour).clamp(max=tis_cap).detach()
        loss = loss * tis
    else:
        tis = torch.ones_like(ratio).detach()
    with torch.no_grad():
        clipped = ((advantages > 0) & (ratio > 1.0 + clip_high)) | ((advantages < 0) & (ratio < 1.0 - clip_low))
        info = {"ratio": ratio.detach(), "clipped": clipped.to(logp.dtype),
                "approx_kl": k3_kl(logp.detach(), behaviour), "tis_weight": tis}
    return loss, info
