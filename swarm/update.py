"""One policy update, its order written once: wait -> renew -> lease -> quarantine -> update -> publish
-> checkpoint -> settle. Rank 0 (``flows/run.py``) runs :func:`run_update` through the trainer's
:class:`~swarm.train.Ledger` (the one writer of policy versions; the checkpoint cadence); torchrun
ranks > 0 run :func:`follow`, the same :func:`apply` as followers (no ledger, no pool: rank 0's
broadcast batch, publishing only bumps the version). :class:`Stages` are the observable stages:
plain functions by default, Prefect tasks in the flow. It reads no config and does not log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from swarm import loop
from swarm.merge import TrainSeq
from swarm.pool import Lease, StepFilter
from swarm.records import Step
from swarm.train import Ledger, Trainer, distributed, items_from_steps, quarantine
from swarm.train.faults import crash_point

__all__ = ["UpdateSettings", "Stages", "train", "lease_usable", "apply", "run_update", "follow"]


@dataclass(frozen=True)
class UpdateSettings:
    """What an update reads from the run's config: batching strategy, leases, advantages."""

    strategy: str
    min_episodes: int
    min_groups: int
    group_size: int
    timeout_s: float
    max_staleness: int | None
    group_by: str = "group"
    scale_std: bool = True
    # the curated set the lease takes from (None: every trainable step) and its name for display ("clean@2")
    curated: StepFilter | None = None
    curation: str | None = None


def train(trainer: Trainer, items: list[TrainSeq], lead: bool = True) -> dict[str, float]:
    """One optimizer step on ``items``; the leader first sends them to the torchrun followers."""
    if lead:
        distributed.broadcast_batch(items, trainer.policy, trainer.version)
    return trainer.update(items)


@dataclass(frozen=True)
class Stages:
    """The stages a caller may wrap to observe them (Prefect tasks); by default the plain functions."""

    wait: Callable[..., Any] = loop.wait_for_batch
    lease: Callable[..., Lease] = loop.lease_batch
    update: Callable[..., dict[str, float]] = train
    publish: Callable[[Ledger, bool], dict[str, float]] = Ledger.publish
    checkpoint: Callable[[Ledger, dict[str, Any]], Any] = Ledger.commit


def lease_usable(ledger: Ledger, s: UpdateSettings, stop: threading.Event, stages: Stages = Stages(),
                 on_poll: Callable[[Any], None] | None = None) -> tuple[Lease, list[Step], int] | None:
    """Wait, renew our pending leases, lease, quarantine: (lease, usable steps, quarantined) or None (stopped).
    Each wait first publishes its filter as the policy's lease plan (what the dashboard shows)."""
    trainer, pool = ledger.trainer, ledger.pool
    flt = loop.trainable_filter(trainer.policy, trainer.version, s.max_staleness, curated=s.curated,
                                nonzero_variance=s.strategy == "groups_var")
    while True:  # an empty lease (the groups went to another trainer first) means: wait again
        pool.set_lease_plan(trainer.policy, flt, s.curation, trainer.version)
        decision = stages.wait(pool, flt, s.strategy, min_episodes=s.min_episodes, min_groups=s.min_groups,
                               group_size=s.group_size, timeout_s=s.timeout_s, clients=pool.sync_clients,
                               on_poll=on_poll, should_stop=stop.is_set)
        if not decision.fire:
            return None
        if s.strategy in ("any_agree", "all_agree"):
            pool.take_agreements()  # the update fired on them
        ledger.renew()  # our own lease must never take back steps we trained but did not settle yet
        lease = stages.lease(pool, flt, decision, ledger.ttl_s)
        steps, bad = quarantine.usable(lease.steps, *quarantine.limits_of(trainer.model))
        if bad:
            quarantine.quarantine(pool, bad)
            if not steps:
                pool.settle(lease.lease_id, [], trainer.version)  # close it; the labels keep them out
        if steps:
            return lease, steps, len(bad)


def apply(trainer: Trainer, items: list[TrainSeq], stages: Stages = Stages(), ledger: Ledger | None = None,
          lease: Lease | None = None, stop: threading.Event | None = None,
          extra: dict[str, Any] | None = None) -> dict[str, float]:
    """Update -> publish -> record the ``lease`` -> checkpoint + settle when due (or stopping); a follower
    (no ``ledger``) only trains and bumps the version."""
    metrics = stages.update(trainer, items, ledger is not None)
    crash_point("after_update")
    if ledger is None:
        trainer.publish(save=False)  # a follower: rank 0 saves, loads and records
        return metrics
    commit = ledger.due() or (stop is not None and stop.is_set())
    metrics.update(stages.publish(ledger, commit))  # an update ending at a checkpoint keeps its adapter
    if lease is not None:
        ledger.trained(lease.lease_id, [st.step_id for st in lease.steps])
    crash_point("after_publish")
    if commit:
        stages.checkpoint(ledger, dict(extra or {}))
    return metrics


def run_update(ledger: Ledger, s: UpdateSettings, stop: threading.Event, stages: Stages = Stages(),
               on_poll: Callable[[Any], None] | None = None, extra: dict[str, Any] | None = None
               ) -> tuple[dict[str, float], list[Step]] | None:
    """One update of ``ledger.trainer`` over ``ledger.pool``: its metrics and trained steps (None: stopped);
    committed at a checkpoint (with ``extra``) when the ledger's cadence is due or ``stop`` is set."""
    t0 = time.perf_counter()
    got = lease_usable(ledger, s, stop, stages, on_poll)
    if got is None:
        return None
    lease, steps, n_bad = got
    lease = lease.model_copy(update={"steps": steps})  # the quarantined ones are settled apart
    t_wait = time.perf_counter() - t0
    metrics = {**loop.batch_metrics(steps, ledger.trainer.version), "pool/quarantined": float(n_bad)}
    items = items_from_steps(steps, group_by=s.group_by, scale_std=s.scale_std)
    metrics.update(apply(ledger.trainer, items, stages, ledger, lease, stop, extra))
    wall = time.perf_counter() - t0
    metrics.update({"time/wait_s": t_wait, "time/update_wall_s": wall,
                    "throughput/steps_per_s": len(steps) / max(wall, 1e-9)})
    return metrics, steps


def follow(trainers: Trainer | Mapping[str, Trainer]) -> int:
    """Torchrun ranks > 0: :func:`apply` rank 0's broadcast batches until it sends None; returns the count."""
    by_policy = dict(trainers) if isinstance(trainers, Mapping) else {trainers.policy: trainers}
    n = 0
    while (msg := distributed.broadcast_object(None)) is not None:
        policy, version, items = msg
        trainer = by_policy[policy] if len(by_policy) > 1 else next(iter(by_policy.values()))
        if version is not None:
            trainer.version = int(version)  # stay in step when rank 0 started from a backend's version
        apply(trainer, items)
        n += 1
    return n
