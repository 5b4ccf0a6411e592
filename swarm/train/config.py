"""Typed trainer settings, validated on construction (errors name the bad field and the fix).

Plain dataclasses: the Hydra entry point builds them; nothing here imports omegaconf.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from swarm.errors import ValidationError
from swarm.lora import LoraSpec
from swarm.merge.modes import MODES

__all__ = ["LoraSpec", "TrainConfig"]


@dataclass(frozen=True)
class TrainConfig:
    """One optimizer step per update; micro-batches accumulate to the full-batch gradient.

    ``ratio``: ``behaviour`` = PPO ratio against the gateway's logprobs; ``decoupled`` = ratio
    against the trainer's own (detached) logprobs with TIS weight ``min(pi/mu, tis_cap)``.
    ``lora = None`` means full fine-tuning. ``temperature`` must be the sampling temperature.
    ``attention``: how tree-merged rows are attended. ``dense`` = a boolean ``(B, 1, L, L)`` mask
    per micro-batch (block-sparse SDPA on SDPA models); ``flex`` = the model switched to flex
    attention with a block mask built from the tree (CUDA only: torch has no flex backward on CPU).
    """

    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float | None = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    ratio: Literal["behaviour", "decoupled"] = "behaviour"
    tis_cap: float | None = None
    kl_coef: float = 0.0
    loss_agg: Literal["token", "sequence"] = "token"
    temperature: float = 1.0
    merge: str = "tree"
    token_budget: int = 4096
    lora: LoraSpec | None = field(default_factory=LoraSpec)
    pad_id: int = 0
    attention: Literal["dense", "flex"] = "dense"
    max_mismatch: float | None = 0.5
    max_stale_serving_s: float | None = 300.0

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValidationError:
            return ValidationError(f"train.{name}: {why}")

        if self.lr <= 0:
            raise bad("lr", f"must be > 0, got {self.lr}")
        if self.temperature <= 0:
            raise bad("temperature", f"must be > 0 (use the sampling temperature), got {self.temperature}")
        if self.merge not in MODES:
            raise bad("merge", f"must be one of {MODES}, got {self.merge!r}")
        if self.token_budget < 1:
            raise bad("token_budget", f"must be >= 1, got {self.token_budget}")
        if self.ratio not in ("behaviour", "decoupled"):
            raise bad("ratio", f"must be 'behaviour' or 'decoupled', got {self.ratio!r}")
        if self.tis_cap is not None and (self.tis_cap <= 0 or self.ratio != "decoupled"):
            raise bad("tis_cap", "must be > 0 and needs ratio='decoupled' (with 'behaviour' the ratio already is pi/mu)")
        if self.loss_agg not in ("token", "sequence"):
            raise bad("loss_agg", f"must be 'token' or 'sequence', got {self.loss_agg!r}")
        if self.attention not in ("dense", "flex"):
            raise bad("attention", f"must be 'dense' or 'flex' (flex: CUDA only), got {self.attention!r}")
        if self.kl_coef < 0:
            raise bad("kl_coef", f"must be >= 0, got {self.kl_coef}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise bad("clip_low/clip_high", "need 0 <= clip_low < 1 and clip_high >= 0")
        if self.max_mismatch is not None and not self.max_mismatch > 0:
            raise bad("max_mismatch", f"must be > 0 nats/token (null: no check), got {self.max_mismatch}")
        if self.max_stale_serving_s is not None and not self.max_stale_serving_s > 0:
            raise bad("max_stale_serving_s", f"must be > 0 seconds (null: no check), got {self.max_stale_serving_s}")
        if isinstance(self.lora, dict):
            object.__setattr__(self, "lora", LoraSpec(**self.lora))
