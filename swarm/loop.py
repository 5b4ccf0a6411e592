"""The training loop's pool-side stages as plain functions: snapshot -> decide -> lease -> measure.
:mod:`swarm.update` runs them in an update's order; the flow (``flows/run.py``) wraps wait and lease as
Prefect tasks; tests call them directly.

It does not train (:mod:`swarm.train`) and does not talk HTTP: it reads the pool directly.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from swarm.batching import Decision, GroupState, Snapshot, Strategy, decide
from swarm.errors import ValidationError
from swarm.pool import Lease, LeaseBook, Lookup, StepFilter
from swarm.pool.engine import Database
from swarm.pool.lease import finished_count, open_groups, ready_rewards
from swarm.records import EpisodeStatus, EpisodeType, RewardStatus, Step

__all__ = ["trainable_filter", "snapshot", "wait_for_batch", "lease_batch", "batch_metrics", "episode_metrics", "eval_summary"]

_SCAN = 100_000  # upper bound on steps read for one snapshot (unconsumed, fresh steps only)


# curation fields training constrains: the values a curation may hold, and what training takes
_TRAINING: dict[str, tuple[tuple[Any, ...], str]] = {
    "consumed": ((None, False), "unconsumed steps"),
    "episode_type": ((None, EpisodeType.train), "train episodes"),
    "reward_status": ((None, RewardStatus.final), "final rewards"),
    "episode_status": ((None, EpisodeStatus.finished), "finished episodes"),
    "include_excluded": ((False,), "no excluded steps"),
    "leased": ((None, False), "steps no live lease holds"),
}


def trainable_filter(policy: str, version: int, max_staleness: int | None, curated: StepFilter | None = None,
                     nonzero_variance: bool = False) -> StepFilter:
    """The filter a trainer of ``policy`` at ``version`` waits, snapshots and leases with: the ``curated``
    selection (None: every step) plus what the algorithm needs: final rewards, finished train episodes,
    unconsumed, not excluded, not staler than ``max_staleness`` versions (the curation's own
    ``max_staleness``, relative to ``version`` too: the stricter), non-zero reward variance when either
    asks. A curated field contradicting training (consumed, an eval or unfinished episode, a pending
    reward, excluded steps, another policy) is a ValidationError naming it."""
    cur = curated or StepFilter()
    for field, (allowed, takes) in _TRAINING.items():
        value = getattr(cur, field)
        if value not in allowed:
            shown = getattr(value, "value", value)
            raise ValidationError(f"curation field {field}={json.dumps(shown)} contradicts training, which takes "
                                  f"{takes}; drop the field from the curation")
    if cur.policy not in (None, policy):
        raise ValidationError(f"curation field policy={cur.policy!r} contradicts training policy {policy!r}; "
                              "drop the field or train that policy")
    limits = [s for s in (max_staleness, cur.max_staleness) if s is not None]
    stale = {"max_staleness": min(limits), "current_version": version} if limits else {
        "max_staleness": None, "current_version": None}
    return StepFilter.trainable(policy=policy, **{**cur.model_dump(exclude_defaults=True, exclude={"policy"}), **stale,
                                                  "nonzero_variance": cur.nonzero_variance or nonzero_variance})


def snapshot(pool: Lookup, flt: StepFilter, active_clients: frozenset[str] = frozenset(),
             agreed_clients: frozenset[str] = frozenset()) -> Snapshot:
    """What the strategies look at: per group, finished episodes' rewards and still-open episodes.

    Steps held by a live lease (this trainer's own updates not yet settled at a checkpoint, or
    another trainer's) are not ready: counting them would fire an update that leases fewer groups.
    """
    rewards: dict[str, dict[str, float]] = defaultdict(dict)
    ready = flt.model_copy(update={"leased": False})
    light = isinstance(pool, Database)
    if light:  # three columns, not whole steps: the wait reads this several times a second
        rows = ready_rewards(pool, ready, limit=_SCAN)
    else:
        rows = [(s.group_id, s.episode_id, s.reward) for s in pool.query_steps(ready, limit=_SCAN)]
    for group_id, episode_id, reward in rows:
        if reward is not None:
            rewards[group_id or episode_id][episode_id] = reward
    n_open: dict[str, int] = defaultdict(int)
    if light:  # one grouped count, not every open episode's record
        for group_id, n in open_groups(pool, EpisodeType.train.value).items():
            if group_id in rewards:
                n_open[group_id] = n
    else:
        for ep in pool.query_episodes(StepFilter(episode_status=EpisodeStatus.open, episode_type=EpisodeType.train),
                                      limit=_SCAN):
            if ep.group_id in rewards:
                n_open[ep.group_id] += 1
    groups = tuple(GroupState(g, tuple(r.values()), n_open[g]) for g, r in rewards.items())
    return Snapshot(groups, active_clients, agreed_clients)


def wait_for_batch(pool: Lookup, flt: StepFilter, strategy: Strategy | str, *, min_episodes: int, min_groups: int,
                   group_size: int, timeout_s: float = 600.0, poll_s: float = 0.25, probe_s: float = 0.05,
                   clients: Callable[[], tuple[frozenset[str], frozenset[str]]] | None = None,
                   on_poll: Callable[[Decision], None] | None = None,
                   should_stop: Callable[[], bool] = lambda: False) -> Decision:
    """Poll the pool until the strategy fires (or ``timeout_s`` passes: TimeoutError).

    The strategy decides on a snapshot every ``poll_s`` (late rewards, expired leases, clients' agreements);
    between snapshots a count of finished episodes is read every ``probe_s`` (one index lookup), and a
    snapshot is taken as soon as enough more episodes finished to change the decision
    (:func:`_needed`): a batch is seen a few ms after its last episode ends, not up to ``poll_s`` later."""
    deadline = time.monotonic() + timeout_s
    agreeing = Strategy(strategy) in (Strategy.any_agree, Strategy.all_agree)  # only C4 / C5 read clients
    probe = (lambda: finished_count(pool)) if isinstance(pool, Database) else None
    while True:
        seen = probe() if probe is not None else 0  # read before the snapshot: nothing ending after it is missed
        active, agreed = clients() if clients and agreeing else (frozenset(), frozenset())
        snap = snapshot(pool, flt, active, agreed)
        d = decide(strategy, snap, min_episodes=min_episodes, min_groups=min_groups, group_size=group_size)
        if on_poll:
            on_poll(d)
        if d.fire or should_stop():
            return d
        if time.monotonic() > deadline:
            raise TimeoutError(f"no batch after {timeout_s:.0f}s: {d.reason} (strategy {Strategy(strategy).value})")
        need = _needed(strategy, snap, min_episodes, min_groups, group_size) if probe is not None else None
        until = time.monotonic() + poll_s
        while (left := until - time.monotonic()) > 0 and not should_stop():
            time.sleep(min(left, probe_s) if need is not None else left)
            if need is not None and probe() - seen >= need:
                break


def _needed(strategy: Strategy | str, snap: Snapshot, min_episodes: int, min_groups: int, group_size: int) -> int | None:
    """How many more episodes must finish, at least, before ``decide`` can fire on ``snap``'s pool (None: it
    does not depend on episodes alone: the clients' agreements). A lower bound: a late reward or an abandoned
    episode can change a group without finishing one, which the next full poll sees."""
    s = Strategy(strategy)
    if s is Strategy.episodes:
        return max(1, min_episodes - sum(len(g.rewards) for g in snap.groups))
    if s not in (Strategy.groups, Strategy.groups_var):
        return None
    ok = [g for g in snap.groups if g.complete(group_size) and (s is Strategy.groups or g.has_variance)]
    # a complete group without variance never gains it: only incomplete groups (and new ones) can still count
    missing = sorted(max(group_size - len(g.rewards), 1) for g in snap.groups if not g.complete(group_size))
    short = max(min_groups - len(ok), 1)
    missing = (missing + [max(group_size, 1)] * short)[:short]
    return max(1, sum(missing))


def lease_batch(pool: LeaseBook, flt: StepFilter, decision: Decision, ttl_s: float = 600.0) -> Lease:
    """Lease exactly the groups the strategy chose (whole groups, never a zero-variance one under C3)."""
    f = flt.model_copy(update={"group_ids": list(decision.group_ids)})
    return pool.lease(f, max_groups=len(decision.group_ids), ttl_s=ttl_s)


def _episode_rewards(steps: Sequence[Step]) -> dict[str, tuple[str, float]]:
    out: dict[str, tuple[str, float]] = {}
    for s in steps:
        if s.reward is not None:
            out[s.episode_id] = (s.task, s.reward)
    return out


def batch_metrics(steps: Sequence[Step], version: int, prefix: str = "") -> dict[str, float]:
    """Reward per episode (overall and per task), staleness and size of a leased batch.

    The per-task mean is logged even when a batch holds one task, so a mixed run's (cocktail) curves
    do not depend on which sub-tasks a small batch happened to draw."""
    eps = _episode_rewards(steps)
    rewards = [r for _, r in eps.values()]
    m: dict[str, float] = {
        f"{prefix}reward/mean": statistics.fmean(rewards) if rewards else 0.0,
        f"{prefix}batch/episodes": float(len(eps)),
        f"{prefix}batch/steps": float(len(steps)),
        f"{prefix}pool/staleness": statistics.fmean(version - s.policy_version for s in steps) if steps else 0.0,
    }
    by_task: dict[str, list[float]] = defaultdict(list)
    for task, r in eps.values():
        by_task[task].append(r)
    for task, rs in by_task.items():
        m[f"{prefix}reward/{task}/mean"] = statistics.fmean(rs)
    return m


def _trained(e: Any, policies: Sequence[str] | None) -> bool:
    """Whether episode ``e`` was played by a trained policy (frozen opponents' seats are ``eval`` episodes
    too, and must not count as the trained side's results); episodes that name no policy count. A pinned
    evaluation's episodes (``flows.eval``: ``eval_run`` in the metadata) report to their own run, never this one."""
    if "eval_run" in e.metadata:
        return False
    policy = e.metadata.get("policy")
    return policies is None or policy is None or policy in policies


def episode_metrics(pool: Lookup, since: float, lookback_s: float = 3600.0,
                    policies: Sequence[str] | None = None) -> dict[str, float]:
    """What the task reported for the episodes that ended since ``since``: ``episodes/<key>`` (train)
    and ``eval/<key>`` (held-out eval groups) are means of the numbers a task's ``run_episode`` /
    ``run_multiagent`` returned (stored in each episode's ``metadata.metrics``), plus ``reward`` and the
    episode count ``n``. Werewolves: ``win`` (per seat of the trained side, so the side's win rate),
    ``win_<role>``, ``rounds``, ``format_penalty``; math: its accuracy parts."""
    # since: the created_at index bounds the scan; ended_since: only this update's episodes come back
    eps = pool.query_episodes(StepFilter(episode_status=EpisodeStatus.finished, since=since - lookback_s,
                                         ended_since=since), limit=_SCAN)
    sums: dict[str, dict[str, list[float]]] = {"episodes": defaultdict(list), "eval": defaultdict(list)}
    for e in eps:
        if not _trained(e, policies):
            continue
        bucket = sums["eval" if e.type == EpisodeType.eval else "episodes"]
        bucket["n"].append(1.0)
        if e.reward is not None:
            bucket["reward"].append(float(e.reward))
        for k, v in (e.metadata.get("metrics") or {}).items():
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                bucket[k].append(float(v))
    out: dict[str, float] = {}
    for prefix, bucket in sums.items():
        for k, vs in bucket.items():
            out[f"{prefix}/{k}"] = float(len(vs)) if k == "n" else statistics.fmean(vs)
    return out


def eval_summary(pool: Lookup, since: float, games: int = 64, policies: Sequence[str] | None = None
                 ) -> dict[str, float]:
    """The run's held-out eval games: mean win (tasks that report ``win``) or reward over the first and
    the last ``games`` games that ended since ``since`` (a game: the episodes sharing ``metadata.game``,
    else one episode): ``summary/eval_<win|reward>_first`` / ``_last``, ``summary/eval_games``; {} without any."""
    eps = pool.query_episodes(StepFilter(episode_type=EpisodeType.eval, episode_status=EpisodeStatus.finished,
                                         since=since), limit=_SCAN)
    eps = [e for e in eps if _trained(e, policies)]
    key = "win" if any("win" in (e.metadata.get("metrics") or {}) for e in eps) else "reward"
    by_game: dict[str, list[Any]] = defaultdict(list)
    for e in eps:
        by_game[str(e.metadata.get("game") or e.episode_id)].append(e)
    rows = []
    for seats in by_game.values():
        vals = [float((e.metadata.get("metrics") or {}).get(key, e.reward if e.reward is not None else 0.0))
                for e in seats]
        rows.append((max(e.ended_at or 0.0 for e in seats), statistics.fmean(vals)))
    if not rows:
        return {}
    rows.sort()
    return {f"summary/eval_{key}_first": statistics.fmean(v for _, v in rows[:games]),
            f"summary/eval_{key}_last": statistics.fmean(v for _, v in rows[-games:]),
            "summary/eval_games": float(len(rows))}
