"""One update's loss, piece by piece: batch-wide weights, one micro-batch's loss, the metric sums.

:func:`batch_weights` fixes the per-item tensors once for the whole merged batch (token weights
normalised over all items, advantages, behaviour logprobs), so that the gradients of the
micro-batches add up to the full-batch gradient. :func:`micro_batch_loss` turns one
micro-batch's target logprobs into the scalar to backward (PPO-clip, plus k3 KL when given
reference logprobs) and, from the same tensors, its train-inference mismatch terms
(``swarm.train.mismatch``: recorded vs recomputed logprobs of the on-policy tokens, no extra forward).
:class:`LossSums` adds the per-token diagnostics over micro-batches (and ranks) and turns them into
``train/`` metrics.

Pure tensor code: no model forward, no optimizer, no logging, no torch.distributed calls (the
caller all-reduces :meth:`LossSums.as_dict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch

from swarm.merge import Collated, TrainSeq
from swarm.merge.layout import PackedRow
from swarm.train.config import TrainConfig
from swarm.train.losses import LossAgg, item_token_weights, k3_kl, ppo_clip_loss
from swarm.train.mismatch import mismatch_terms

__all__ = ["BatchWeights", "MicroLoss", "LossSums", "batch_weights", "micro_batch_loss"]


@dataclass(frozen=True)
class BatchWeights:
    """Per-item tensors fixed over the whole batch, indexed by a target's item."""

    token_weight: torch.Tensor  # (items,) loss weight of each of the item's target tokens
    advantage: torch.Tensor  # (items,)
    behaviour: torch.Tensor  # (items, max response length) logprobs, NaN where unrecorded
    on_policy: torch.Tensor | None = None  # (items,) bool: sampled at the version being trained (None: all)


@dataclass(frozen=True)
class MicroLoss:
    """One micro-batch's loss (``loss`` is what to backward) and its detached diagnostics."""

    loss: torch.Tensor  # scalar: sum of weighted token losses
    pg: torch.Tensor  # scalar: the policy-gradient part of ``loss``, detached
    kl_ref: torch.Tensor | None  # (T,) k3 KL to the reference, None without one
    info: dict[str, torch.Tensor]  # ppo_clip_loss diagnostics, (T,) each
    entropy: torch.Tensor  # (T,)
    tokens: int
    mismatch: torch.Tensor | None = None  # swarm.train.mismatch.mismatch_terms of the micro-batch, on the device


def batch_weights(items: list[TrainSeq], rows: list[PackedRow], loss_agg: LossAgg, device: torch.device,
                  version: int | None = None) -> BatchWeights:
    """Token weights (from each item's target count in ``rows``), advantages and behaviour logprobs; ``version``:
    the version being trained (items sampled at it are on-policy for the mismatch; None: every item is)."""
    n_targets = [0] * len(items)
    for row in rows:
        for i in row.target_item:
            n_targets[i] += 1
    weight = item_token_weights(n_targets, loss_agg).float().to(device)
    adv = torch.tensor([it.advantage for it in items], dtype=torch.float32, device=device)
    width = max((len(it.response_ids) for it in items), default=0)
    beh = torch.full((len(items), max(width, 1)), float("nan"))
    for i, it in enumerate(items):
        if it.behaviour_logprobs is not None and it.response_ids:
            beh[i, : len(it.response_ids)] = torch.tensor(it.behaviour_logprobs)
    on = None if version is None else torch.tensor([it.policy_version == version for it in items], dtype=torch.bool,
                                                   device=device)
    return BatchWeights(weight, adv, beh.to(device), on)


def micro_batch_loss(
    logp: torch.Tensor,
    entropy: torch.Tensor,
    col: Collated,
    weights: BatchWeights,
    cfg: TrainConfig,
    ref_logp: torch.Tensor | None = None,
) -> MicroLoss:
    """PPO-clip (+ ``cfg.kl_coef`` times k3 KL to ``ref_logp``) of one micro-batch's targets."""
    item, offset = col.target_item.to(logp.device), col.target_offset.to(logp.device)
    behaviour = weights.behaviour[item, offset]
    pg, info = ppo_clip_loss(logp, behaviour, weights.advantage[item],
                             proximal_logp=logp.detach() if cfg.ratio == "decoupled" else None, clip_low=cfg.clip_low,
                             clip_high=cfg.clip_high, tis_cap=cfg.tis_cap)
    tok_loss, kl = pg, None
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        tok_loss = pg + cfg.kl_coef * kl
    w = weights.token_weight[item]
    return MicroLoss(loss=(w * tok_loss).sum(), pg=(w * pg.detach()).sum(), kl_ref=None if kl is None else kl.detach(),
                     info=info, entropy=entropy, tokens=int(col.target_ids.numel()),
                     mismatch=mismatch_terms(logp, behaviour, None if weights.on_policy is None else weights.on_policy[item]))


@dataclass
class LossSums:
    """Running sums of an update's weighted losses and per-token diagnostics."""

    loss: float = 0.0
    pg: float = 0.0
    kl_ref: float = 0.0
    clipped: float = 0.0
    approx_kl: float = 0.0
    entropy: float = 0.0
    ratio: float = 0.0
    tis: float = 0.0
    count: float = 0.0

    def add(self, m: MicroLoss) -> None:
        """Add one micro-batch (after its backward: ``.item()`` syncs the device)."""
        if m.kl_ref is not None:
            self.kl_ref += m.kl_ref.sum().item()
        self.loss += m.loss.item()
        self.pg += m.pg.item()
        self.clipped += m.info["clipped"].sum().item()
        self.approx_kl += m.info["approx_kl"].sum().item()
        self.ratio += m.info["ratio"].sum().item()
        self.tis += m.info["tis_weight"].sum().item()
        self.entropy += m.entropy.sum().item()
        self.count += m.tokens

    def as_dict(self) -> dict[str, float]:
        """The sums by name (what ``distributed.all_reduce_sums`` takes)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, sums: dict[str, float]) -> LossSums:
        """Inverse of :meth:`as_dict`."""
        return cls(**{f.name: float(sums[f.name]) for f in fields(cls)})

    def metrics(self, with_kl: bool) -> dict[str, float]:
        """``train/`` metrics: the loss sums as they are, per-token diagnostics averaged."""
        count = int(self.count)
        n = max(count, 1)
        out = {
            "train/loss": self.loss,
            "train/pg_loss": self.pg,
            "train/clip_frac": self.clipped / n,
            "train/approx_kl": self.approx_kl / n,
            "train/ratio_mean": self.ratio / n,
            "train/tis_weight_mean": self.tis / n,
            "train/entropy": self.entropy / n,
            "train/tokens": float(count),
        }
        if with_kl:
            out["train/kl_ref"] = self.kl_ref / n
        return out
