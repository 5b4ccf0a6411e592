"""Core records: the step-level MDP that every part of swarm speaks.

A :class:`Step` is one LLM call (or one white-box submission): state = the prompt (messages and
the exact prompt token ids), action = the response (text, tool calls, exact response token ids
and their sampling logprobs), reward (the step's own, or the episode's). An :class:`Episode`
is one run of a task instance by one agent; :class:`Event` carries live events, human feedback
and late rewards; :class:`PolicyVersion` records each published set of weights; :class:`Label`
is a curation mark on a step or episode.

These are plain pydantic models: validation only, no storage and no I/O. Validation errors
name the field that is wrong (pydantic's ``loc``).
"""

from __future__ import annotations

import math
import secrets
import time
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["Source", "EpisodeStatus", "EpisodeType", "RewardStatus", "Episode", "Step", "Event", "PolicyVersion",
           "Label", "new_id", "now"]


def new_id(prefix: str) -> str:
    """A fresh, unguessable id such as ``step-3f2a...`` (128 random bits as hex; ``uuid4`` cost 10x the CPU)."""
    return f"{prefix}-{secrets.token_hex(16)}"


def now() -> float:
    """Wall-clock seconds since the epoch; the one clock records use."""
    return time.time()


class Source(StrEnum):
    """Who produced a step: the gateway on a black-box agent's call, a white-box agent, or a service."""

    blackbox = "blackbox"
    whitebox = "whitebox"
    service = "service"


class EpisodeStatus(StrEnum):
    open = "open"
    finished = "finished"
    abandoned = "abandoned"
    failed = "failed"


class EpisodeType(StrEnum):
    train = "train"
    eval = "eval"


class RewardStatus(StrEnum):
    pending = "pending"
    final = "final"


def _finite(name: str, value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", use_enum_values=False, validate_assignment=False)


class Episode(_Record):
    """One run of a task instance by one agent (one player of a game is one episode)."""

    episode_id: str = Field(default_factory=lambda: new_id("ep"))
    task: str = Field(min_length=1)
    group_id: str | None = None
    client_id: str | None = None
    type: EpisodeType = EpisodeType.train
    status: EpisodeStatus = EpisodeStatus.open
    reward: float | None = None
    reward_status: RewardStatus = RewardStatus.pending
    timeout_s: float | None = Field(default=None, gt=0)
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)
    ended_at: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("reward")
    @classmethod
    def _reward_finite(cls, v: float | None) -> float | None:
        return _finite("reward", v)


class Step(_Record):
    """One LLM call: exact prompt ids, exact response ids and the logprobs they were sampled with."""

    step_id: str = Field(default_factory=lambda: new_id("step"))
    episode_id: str = Field(min_length=1)
    index: int = Field(default=0, ge=0)
    parent_step_id: str | None = None
    task: str = ""
    group_id: str | None = None
    policy: str = Field(default="default", min_length=1)
    policy_version: int = Field(default=0, ge=0)
    source: Source = Source.blackbox
    prompt_messages: list[dict[str, Any]] | None = None
    prompt_ids: list[int] = Field(default_factory=list)
    response_text: str | None = None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_logprobs: list[float] | None = None
    finish_reason: str | None = None
    response_id: str | None = None
    prefix_consistent: bool | None = None
    reward: float | None = None
    reward_status: RewardStatus = RewardStatus.pending
    created_at: float = Field(default_factory=now)
    timings: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("prompt_ids", "response_ids")
    @classmethod
    def _ids_non_negative(cls, v: list[int]) -> list[int]:
        if v and min(v) < 0:  # one C-level pass; find the position only on failure
            i = next(i for i, t in enumerate(v) if t < 0)
            raise ValueError(f"token ids must be >= 0, got {v[i]} at position {i}")
        return v

    @field_validator("response_logprobs")
    @classmethod
    def _logprobs_valid(cls, v: list[float] | None) -> list[float] | None:
        # max() is not reliable with NaN in the list, hence the separate isnan pass
        if v and (max(v) > 1e-4 or any(map(math.isnan, v))):
            i = next(i for i, lp in enumerate(v) if math.isnan(lp) or lp > 1e-4)
            raise ValueError(f"logprobs must be <= 0 and not NaN, got {v[i]} at position {i}")
        return v

    @field_validator("reward")
    @classmethod
    def _reward_finite(cls, v: float | None) -> float | None:
        return _finite("reward", v)

    @model_validator(mode="after")
    def _consistent(self) -> Step:
        if self.response_logprobs is not None and len(self.response_logprobs) != len(self.response_ids):
            raise ValueError(
                f"response_logprobs has {len(self.response_logprobs)} entries but response_ids has "
                f"{len(self.response_ids)}; they must be the same length"
            )
        if self.parent_step_id is not None and self.parent_step_id == self.step_id:
            raise ValueError("parent_step_id must not equal step_id")
        return self

    @property
    def length(self) -> int:
        """Total tokens: prompt plus response."""
        return len(self.prompt_ids) + len(self.response_ids)


class Event(_Record):
    """A live event, human feedback (rating / correction) or late reward on an episode or step."""

    event_id: str = Field(default_factory=lambda: new_id("ev"))
    kind: Literal["event", "feedback", "reward"] = "event"
    episode_id: str | None = None
    step_id: str | None = None
    name: str = ""
    value: float | None = None
    rating: float | None = None
    correction: str | None = None
    source: Source = Source.service
    payload: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=now)

    @field_validator("value", "rating")
    @classmethod
    def _finite_numbers(cls, v: float | None) -> float | None:
        return _finite("value", v)

    @model_validator(mode="after")
    def _attached(self) -> Event:
        if self.episode_id is None and self.step_id is None:
            raise ValueError("an event must name an episode_id or a step_id")
        if self.kind == "reward" and self.value is None:
            raise ValueError("a reward event needs a value")
        return self


class PolicyVersion(_Record):
    """One published set of weights of a named policy; steps carry the version that made them."""

    policy: str = Field(min_length=1)
    version: int = Field(ge=0)
    adapter_path: str | None = None
    created_at: float = Field(default_factory=now)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Label(_Record):
    """A curation mark on a step or an episode; ``exclude`` keeps it out of training."""

    label_id: str = Field(default_factory=lambda: new_id("lbl"))
    target: Literal["step", "episode"]
    target_id: str = Field(min_length=1)
    label: str = Field(min_length=1)
    exclude: bool = False
    note: str = ""
    created_at: float = Field(default_factory=now)
