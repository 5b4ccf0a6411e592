"""The curation filter: one typed object for "which steps", shared by the pool, the HTTP API,
the dashboard and the trainer, so a selection means the same thing everywhere.

It only describes a selection; :mod:`swarm.pool.store` turns it into indexed SQL.
Field names are the JSON / query-string keys of the HTTP API.

Bounded: at most :data:`MAX_METADATA_KEYS` metadata keys (each is a JSON condition on two columns)
and :data:`MAX_GROUP_IDS` group ids (bound as one parameter: :meth:`swarm.pool.engines.Dialect.in_ids`);
more is a validation error (a 400 over HTTP).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from swarm.records import EpisodeStatus, EpisodeType, RewardStatus, Source

__all__ = ["StepFilter", "MAX_METADATA_KEYS", "MAX_GROUP_IDS"]

MAX_METADATA_KEYS = 64
MAX_GROUP_IDS = 100_000


class StepFilter(BaseModel):
    """Which steps to read, count, lease or export. ``None`` means "any"."""

    model_config = ConfigDict(extra="forbid")

    policy: str | None = None
    task: str | None = None
    source: Source | None = None
    episode_id: str | None = None
    group_id: str | None = None
    # exactly these groups (a group is a group_id, or the step_id of an ungrouped step)
    group_ids: list[str] | None = Field(default=None, max_length=MAX_GROUP_IDS)
    episode_type: EpisodeType | None = None
    reward_status: RewardStatus | None = None
    episode_status: EpisodeStatus | None = None
    # staleness: keep steps with policy_version >= current_version - max_staleness
    max_staleness: int | None = Field(default=None, ge=0)
    current_version: int | None = Field(default=None, ge=0)
    min_length: int | None = Field(default=None, ge=0)
    max_length: int | None = Field(default=None, ge=0)
    # drop whole groups whose (final) rewards all equal each other: GRPO learns nothing from them
    nonzero_variance: bool = False
    min_group_size: int | None = Field(default=None, ge=1)
    since: float | None = None
    until: float | None = None
    # the episode ended at or after this time (unfinished episodes never match)
    ended_since: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict, max_length=MAX_METADATA_KEYS)
    label: str | None = None
    # steps or episodes labelled with exclude=True are dropped unless this is set
    include_excluded: bool = False
    # None: any; False: not yet consumed by an ack; True: consumed
    consumed: bool | None = None
    # None: any; False: not held by a live (unexpired) lease; True: held by one
    leased: bool | None = None

    @model_validator(mode="after")
    def _consistent(self) -> StepFilter:
        if self.max_staleness is not None and self.current_version is None:
            raise ValueError("max_staleness needs current_version (the version staleness is relative to)")
        if self.min_length is not None and self.max_length is not None and self.min_length > self.max_length:
            raise ValueError("min_length must be <= max_length")
        if self.since is not None and self.until is not None and self.since > self.until:
            raise ValueError("since must be <= until")
        return self

    @classmethod
    def trainable(cls, policy: str | None = None, **kw: Any) -> StepFilter:
        """The trainer's default: final rewards, finished train episodes, not consumed."""
        base: dict[str, Any] = dict(policy=policy, reward_status=RewardStatus.final,
                                    episode_status=EpisodeStatus.finished, episode_type=EpisodeType.train,
                                    consumed=False)
        base.update(kw)
        return cls(**base)
