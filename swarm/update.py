"""One policy update, its order written once: wait -> renew -> lease -> quarantine -> update -> publish
-> checkpoint -> settle. Rank 0 (``flows/run.py``) runs :func:`run_update` through the trainer's
:class:`~swarm.train.Ledger` (the one writer of policy versions; the checkpoint cadence); torchrun
ranks > 0 run :func:`follow`, the same :func:`apply` as followers (no ledger, no pool: rank 0's
broadcast batch, publishing only bumps the version). :class:`Stages` are the observable stages:
plain functions by default, Prefect tasks in the flow. It reads no config and does not log.

A script (``benchmarks/``) trains through :func:`run_updates`: the flow's updates for one policy, then
the closing checkpoint, without Prefect, MLflow or the run's control. Version numbers are assigned in one
place, :meth:`swarm.train.Trainer.publish`, and written into the pool only by :meth:`Ledger.publish`.

Each update's metrics carry the train-inference mismatch of the steps it trained (``mismatch/``, computed by
the trainer in its forward: :mod:`swarm.train.mismatch`) and, after the publish, the version each backend
replica serves (``policy/served_version/<replica>``: :func:`swarm.train.health.served_versions`); what a run
does about them (warn, stop) is :class:`swarm.train.health.RunHealth`, applied by the flow.

Human feedback (docs/gateway.md "Feedback that trains") enters between the lease and the items:
the leased steps' rewards go through the rating rule, and pending corrections join the batch as
supervised items, recorded in the pool's ``feedback_uses`` once the update has published. Under
the ``fill`` rule, rated steps without a reward get it in the pool before each wait, so they can
be leased at all.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from swarm import loop
from swarm.merge import TrainSeq
from swarm.pool import Lease, StepFilter
from swarm.pool.engine import Database
from swarm.pool.feedback import has_feedback
from swarm.records import Step
from swarm.train import Ledger, Trainer, distributed, items_from_steps, quarantine
from swarm.train.faults import crash_point
from swarm.train.feedback import RatingRule, correction_items, fill_rewards, rated_rewards, step_ratings
from swarm.train.health import served_version_metrics

__all__ = ["UpdateSettings", "Stages", "Clock", "train", "lease_usable", "apply", "run_update", "run_updates", "follow",
           "rate", "pending_corrections", "fill_from_ratings"]


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
    # human feedback (flows.config FeedbackSection): the rating rule and the corrections' weight and bounds
    rating_rule: RatingRule = RatingRule()
    correction_weight: float = 1.0
    correction_updates: int = 1
    max_corrections: int = 8


class Clock:
    """Wall seconds per phase of one update, summed over repeats (a wait whose lease came back empty):
    ``with clock("lease"): ...`` adds to ``time/lease_s``. What an update costs outside training is read
    off these (docs/guide.md "What an update costs", ``benchmarks/update_bench.py``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] += time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"time/{k}_s": v for k, v in self.seconds.items()}


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
                 on_poll: Callable[[Any], None] | None = None, clock: Clock | None = None
                 ) -> tuple[Lease, list[Step], int] | None:
    """Wait, renew our pending leases, lease, quarantine: (lease, usable steps, quarantined) or None (stopped).
    Each wait first publishes its filter as the policy's lease plan (what the dashboard shows); ``clock``
    times the phases (``plan``, ``wait``, ``renew``, ``lease``, ``quarantine``)."""
    trainer, pool = ledger.trainer, ledger.pool
    clock = clock or Clock()
    flt = loop.trainable_filter(trainer.policy, trainer.version, s.max_staleness, curated=s.curated,
                                nonzero_variance=s.strategy == "groups_var")
    while True:  # an empty lease (the groups went to another trainer first) means: wait again
        with clock("plan"):
            pool.set_lease_plan(trainer.policy, flt, s.curation, trainer.version)
        with clock("wait"):
            decision = stages.wait(pool, flt, s.strategy, min_episodes=s.min_episodes, min_groups=s.min_groups,
                                   group_size=s.group_size, timeout_s=s.timeout_s, clients=pool.sync_clients,
                                   on_poll=on_poll, should_stop=stop.is_set)
        if not decision.fire:
            return None
        with clock("renew"):
            if s.strategy in ("any_agree", "all_agree"):
                pool.take_agreements()  # the update fired on them
            ledger.renew()  # our own lease must never take back steps we trained but did not settle yet
        with clock("lease"):
            lease = stages.lease(pool, flt, decision, ledger.ttl_s)
        with clock("quarantine"):
            steps, bad = quarantine.usable(lease.steps, *quarantine.limits_of(trainer.model))
            if bad:
                quarantine.quarantine(pool, bad)
                if not steps:
                    pool.settle(lease.lease_id, [], trainer.version)  # close it; the labels keep them out
        if steps:
            return lease, steps, len(bad)


def apply(trainer: Trainer, items: list[TrainSeq], stages: Stages = Stages(), ledger: Ledger | None = None,
          lease: Lease | None = None, stop: threading.Event | None = None,
          extra: dict[str, Any] | None = None, after: int | None = None,
          clock: Clock | None = None) -> dict[str, float]:
    """Update -> publish -> record the ``lease`` -> checkpoint + settle when due (or stopping); a follower
    (no ``ledger``) only trains and publishes the version after ``after`` (rank 0's before this update).
    ``clock`` times the stages (``train``, ``publish_stage``, ``journal``, ``checkpoint``)."""
    clock = clock or Clock()
    with clock("train"):
        metrics = stages.update(trainer, items, ledger is not None)
    crash_point("after_update")
    if ledger is None:
        trainer.publish(save=False, after=after)  # a follower: rank 0 saves, loads and records
        return metrics
    commit = ledger.due() or (stop is not None and stop.is_set())
    with clock("publish_stage"):
        metrics.update(stages.publish(ledger, commit))  # an update ending at a checkpoint keeps its adapter
    with clock("journal"):
        if lease is not None:
            ledger.trained(lease.lease_id, [st.step_id for st in lease.steps], lease.expires_at)
    crash_point("after_publish")
    with clock("checkpoint"):
        if commit:
            stages.checkpoint(ledger, dict(extra or {}))
    return metrics


def run_update(ledger: Ledger, s: UpdateSettings, stop: threading.Event, stages: Stages = Stages(),
               on_poll: Callable[[Any], None] | None = None, extra: dict[str, Any] | None = None
               ) -> tuple[dict[str, float], list[Step]] | None:
    """One update of ``ledger.trainer`` over ``ledger.pool``: its metrics and trained steps (None: stopped);
    committed at a checkpoint (with ``extra``) when the ledger's cadence is due or ``stop`` is set.

    Its ``time/<phase>_s`` metrics say where the wall time went: ``fill``, ``plan``, ``wait`` (for the
    strategy to fire), ``renew``, ``lease``, ``quarantine``, ``feedback_read`` (ratings and corrections),
    ``items`` (advantages), ``train`` (the update stage; the trainer's own ``update_s`` inside it),
    ``publish_stage``, ``journal``, ``checkpoint`` (+ settle), ``served_version``, ``feedback_write``;
    ``update_wall_s`` is all of it and ``overhead_s`` = ``update_wall_s - wait_s - update_s``.
    ``collect/steps_during_update``: steps of this policy the clients recorded after the lease while the
    trainer was busy (train, publish, checkpoint), the overlap of generation and training (``collect_count``
    is what counting them costs)."""
    clock = Clock()
    t0 = time.perf_counter()
    with clock("fill"):
        if s.rating_rule.mode == "fill" and _any_feedback(ledger):
            fill_from_ratings(ledger, s)
    got = lease_usable(ledger, s, stop, stages, _filling(ledger, s, on_poll), clock)
    if got is None:
        return None
    lease, steps, n_bad = got
    lease = lease.model_copy(update={"steps": steps})  # the quarantined ones are settled apart
    metrics = {**loop.batch_metrics(steps, ledger.trainer.version), "pool/quarantined": float(n_bad)}
    with clock("feedback_read"):  # one index lookup while no feedback was ever posted (the usual case)
        if _uses_feedback(s) and _any_feedback(ledger):
            steps, fb_metrics = rate(ledger, s, steps)
            corrections = pending_corrections(ledger, s)
        else:  # what rate and pending_corrections give without any feedback, without reading the pool
            fb_metrics = {} if s.rating_rule.mode == "ignore" else {"feedback/rated_steps": 0.0}
            corrections = []
    with clock("items"):
        items = items_from_steps(steps, group_by=s.group_by, scale_std=s.scale_std) + corrections
    metrics.update(fb_metrics)
    if s.correction_weight > 0:
        metrics["feedback/corrections"] = float(len(corrections))
    t_busy = time.time()  # from here to the end the trainer is busy: what do the clients record meanwhile?
    metrics.update(apply(ledger.trainer, items, stages, ledger, lease, stop, extra, clock=clock))
    with clock("served_version"):
        metrics.update(served_version_metrics(ledger.trainer.backend, ledger.trainer.policy))
    with clock("feedback_write"):
        if corrections:  # published: these corrections count as trained once more
            ledger.pool.record_feedback_uses([c.step_id for c in corrections], ledger.trainer.version,
                                             ledger.trainer.policy)
    with clock("collect_count"):
        metrics["collect/steps_during_update"] = float(ledger.pool.count_steps(
            StepFilter(policy=ledger.trainer.policy, since=t_busy, until=time.time())))
    wall = time.perf_counter() - t0
    metrics.update(clock.metrics())
    metrics.update({"time/update_wall_s": wall, "throughput/steps_per_s": len(steps) / max(wall, 1e-9),
                    "time/overhead_s": wall - clock.seconds["wait"] - metrics.get("time/update_s", 0.0)})
    return metrics, steps


def run_updates(ledger: Ledger, s: UpdateSettings, updates: int, stop: threading.Event | None = None,
                on_update: Callable[[dict[str, float], list[Step]], None] | None = None,
                stages: Stages = Stages()) -> int:
    """Up to ``updates`` updates (:func:`run_update`) of ``ledger.trainer``, fewer when ``stop`` is set; then the
    closing checkpoint (:meth:`Ledger.commit`: settles what they trained); returns how many ran. ``on_update``
    gets each update's metrics and trained steps, and may set ``stop`` (checked between updates).

    What ``flows.run`` does for one policy (renew, quarantine, feedback, checkpoint cadence, settle), for a
    script that builds its own ``Ledger(trainer, pool, every=..., ttl_s=...)``. An error propagates with
    the pending leases unsettled, as in a crash: :meth:`Ledger.resume` settles what the last checkpoint holds.
    """
    stop = stop if stop is not None else threading.Event()
    done = 0
    while done < updates and not stop.is_set():
        got = run_update(ledger, s, stop, stages)
        if got is None:
            break
        done += 1
        if on_update is not None:
            on_update(*got)
    stages.checkpoint(ledger, {})
    return done


def fill_from_ratings(ledger: Ledger, s: UpdateSettings) -> int:
    """Under the ``fill`` rule: rated, finished steps (or episodes) of the trainer's policy without a
    reward get the mapped rating as their final reward (recorded with the rater's source); returns how many."""
    if s.rating_rule.mode != "fill":
        return 0
    pool = ledger.pool
    todo = fill_rewards(pool.unrewarded_ratings(ledger.trainer.policy), s.rating_rule)
    for kind, target, reward, source in todo:
        pool.report_reward(**{f"{kind}_id": target}, reward=reward, source=source, final=True)
    return len(todo)


def _uses_feedback(s: UpdateSettings) -> bool:
    """Whether the settings read any feedback: a rating rule, or corrections that train."""
    return s.rating_rule.mode != "ignore" or (s.correction_weight > 0 and s.max_corrections >= 1)


def _any_feedback(ledger: Ledger) -> bool:
    """Whether the pool holds any feedback at all (a pool without the cheap check: assume it does)."""
    return has_feedback(ledger.pool) if isinstance(ledger.pool, Database) else True


def _filling(ledger: Ledger, s: UpdateSettings, on_poll: Callable[[Any], None] | None,
             every_s: float = 1.0) -> Callable[[Any], None] | None:
    """``on_poll`` that also fills rewards from ratings (at most every ``every_s``) while the wait polls."""
    if s.rating_rule.mode != "fill":
        return on_poll
    last = [time.monotonic()]

    def poll(decision: Any) -> None:
        if on_poll is not None:
            on_poll(decision)
        if not decision.fire and time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            if _any_feedback(ledger):
                fill_from_ratings(ledger, s)
    return poll


def rate(ledger: Ledger, s: UpdateSettings, steps: list[Step]) -> tuple[list[Step], dict[str, float]]:
    """The leased steps with their rewards after the rating rule (one pool read), and ``feedback/rated_steps``."""
    if s.rating_rule.mode == "ignore":
        return steps, {}
    ratings = step_ratings(steps, ledger.pool.feedback_ratings([st.step_id for st in steps]))
    rewards = rated_rewards([st.reward for st in steps], ratings, s.rating_rule)
    out = [st if r == st.reward else st.model_copy(update={"reward": r}) for st, r in zip(steps, rewards, strict=True)]
    return out, {"feedback/rated_steps": float(sum(q is not None for q in ratings))}


def pending_corrections(ledger: Ledger, s: UpdateSettings) -> list[TrainSeq]:
    """Supervised items of the corrections still to train (one pool read); too long ones are skipped."""
    if s.correction_weight <= 0 or s.max_corrections < 1:
        return []
    tr = ledger.trainer
    vocab, max_len = quarantine.limits_of(tr.model)
    found = ledger.pool.pending_corrections(tr.policy, max_uses=s.correction_updates, limit=s.max_corrections)
    ok = [c for c in found if (max_len is None or len(c.prompt_ids) + len(c.response_ids) <= max_len)
          and all(t < vocab for t in c.prompt_ids + c.response_ids)]
    return correction_items(ok, s.correction_weight, tr.version)


def follow(trainers: Trainer | Mapping[str, Trainer]) -> int:
    """Torchrun ranks > 0: :func:`apply` rank 0's broadcast batches until it sends None; returns the count."""
    by_policy = dict(trainers) if isinstance(trainers, Mapping) else {trainers.policy: trainers}
    n = 0
    while (msg := distributed.broadcast_object(None)) is not None:
        policy, version, items = msg
        trainer = by_policy[policy] if len(by_policy) > 1 else next(iter(by_policy.values()))
        # rank 0's number: in step even when rank 0 started from a backend's version
        apply(trainer, items, after=None if version is None else int(version))
        n += 1
    return n
