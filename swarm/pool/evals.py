"""Held-out results per policy version, kept in the pool beside the data that made the version.

A row is one evaluation of one version of one policy on one task: ``source`` ``run`` (a training
run's own eval groups, attributed to the version that played them) or ``pinned`` (an evaluation of a
given version or checkpoint, possibly while a later version trains). MLflow gets the same numbers;
the pool keeps them so lineage ("how did version 7 do?") needs nothing else.

A mixin of :class:`swarm.pool.store.Pool`; same transactions and errors. It does not run episodes
(``flows.eval`` and the training flow do) and does not aggregate them (the caller passes means).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from swarm.pool.checks import coerce
from swarm.pool.engine import Database
from swarm.pool.schema import ID_LEN, NAME_LEN
from swarm.pool.schema import eval_results as R
from swarm.records import new_id, now

__all__ = ["EvalResult", "EvalsMixin"]


class EvalResult(BaseModel):
    """One evaluation of ``policy`` at ``version`` on ``task``: episode count, mean reward, task metrics."""

    model_config = ConfigDict(extra="forbid")

    eval_id: str = Field(default_factory=lambda: new_id("eval"), min_length=1, max_length=ID_LEN)
    policy: str = Field(min_length=1, max_length=NAME_LEN)
    version: int = Field(ge=0)
    task: str = Field(min_length=1, max_length=NAME_LEN)
    source: Literal["run", "pinned"] = "run"
    episodes: int = Field(ge=0)
    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)  # e.g. {"win": 0.25} (means over the episodes)
    metadata: dict[str, Any] = Field(default_factory=dict)  # mlflow run id, checkpoint, seeds, ...
    created_at: float = Field(default_factory=now)

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("reward must be finite")
        return v

    @field_validator("metrics")
    @classmethod
    def _finite_metrics(cls, v: Mapping[str, float]) -> dict[str, float]:
        bad = [k for k, x in v.items() if not math.isfinite(float(x))]
        if bad:
            raise ValueError(f"metrics must be finite: {bad}")
        return {str(k): float(x) for k, x in v.items()}


class EvalsMixin(Database):
    """``add_eval_result`` and ``eval_results`` for :class:`swarm.pool.store.Pool`."""

    def add_eval_result(self, result: EvalResult | Mapping[str, Any]) -> EvalResult:
        """Store one evaluation (re-adding the same ``eval_id`` is a no-op)."""
        r = coerce(EvalResult, result, "eval result")
        row = r.model_dump()
        row["meta"] = row.pop("metadata")
        with self._tx(write=True) as c:
            if c.execute(sa.select(R.c.eval_id).where(R.c.eval_id == r.eval_id)).first() is None:
                c.execute(R.insert(), [row])
        return r

    def eval_results(self, policy: str | None = None, version: int | None = None,
                     limit: int = 1000) -> list[EvalResult]:
        """Evaluations (of ``policy``, of ``version``), oldest first, at most ``limit``."""
        q = sa.select(R).order_by(R.c.policy, R.c.version, R.c.created_at, R.c.eval_id).limit(limit)
        if policy is not None:
            q = q.where(R.c.policy == policy)
        if version is not None:
            q = q.where(R.c.version == version)
        with self._tx() as c:
            rows = [dict(m) for m in c.execute(q).mappings()]
        return [EvalResult(**{**{k: v for k, v in m.items() if k != "meta"}, "metadata": m["meta"]}) for m in rows]
