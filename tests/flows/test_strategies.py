"""Each sample-collection strategy (C1-C5) in a real training flow: 2 updates, real workers, the effect seen in the pool."""

from __future__ import annotations

import statistics
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from flows.train import train_flow
from swarm.client import WorkerConfig, run_worker
from swarm.pool import Pool, StepFilter
from swarm.pool.schema import episodes as E
from swarm.pool.schema import leases as LS
from swarm.pool.schema import steps as S
from swarm.records import Episode
from swarm.stack import free_port

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

GROUP = 4  # small groups keep each run short on the tiny model
Config = Callable[..., dict[str, Any]]


def _run(flow_config: Config, *overrides: str) -> tuple[dict[str, Any], dict[str, Any]]:
    cfg = flow_config("train.updates=2", f"task.group_size={GROUP}", *overrides)
    summary = train_flow(cfg)
    assert summary["status"] == "FINISHED" and summary["updates"] == 2, summary
    return cfg, summary


@contextmanager
def _pool(cfg: dict[str, Any]) -> Iterator[Pool]:
    pool = Pool(cfg["pool"]["url"])
    try:
        yield pool
    finally:
        pool.close()


def _trained(pool: Pool) -> dict[int, dict[str, dict[str, float]]]:
    """Trained episodes' rewards by the version that consumed them, then by group: {version: {group: {episode: r}}}."""
    q = (sa.select(S.c.consumed_version, S.c.group_id, S.c.episode_id, E.c.reward)
         .join(E, E.c.episode_id == S.c.episode_id).where(S.c.consumed_version.is_not(None)))
    out: dict[int, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    with pool.engine.connect() as c:
        for version, group, episode, reward in c.execute(q):
            out[version][group][episode] = reward
    assert sorted(out) == [1, 2], sorted(out)
    return out


def _episodes(pool: Pool) -> dict[str, list[Episode]]:
    """Finished train episodes by group."""
    out: dict[str, list[Episode]] = defaultdict(list)
    for e in pool.query_episodes(StepFilter(episode_status="finished", episode_type="train"), limit=100_000):
        out[e.group_id].append(e)
    return out


def _completed_at(eps: list[Episode]) -> float:
    return max(e.ended_at for e in eps)


def _lease_times(pool: Pool) -> list[float]:
    """When each trained lease was taken, in order (one per update)."""
    q = sa.select(LS.c.created_at).where(LS.c.consumed_version.is_not(None)).order_by(LS.c.created_at)
    with pool.engine.connect() as c:
        return [float(t) for t in c.execute(q).scalars()]


def _takes(pool: Pool) -> list[tuple[float, set[str], float]]:
    """Each take of agreements by the trainer: (taken_at, whose, earliest agreement it consumed), in order."""
    by_take: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for a in pool.agreement_log(limit=100_000):
        if a["taken_at"] is not None:
            by_take[a["taken_at"]].append(a)
    return [(t, {a["client_id"] for a in rows}, min(a["created_at"] for a in rows))
            for t, rows in sorted(by_take.items())]


def test_c1_episodes_fires_on_enough_finished_episodes(flow_config: Config) -> None:
    """C1: each update trains at least ``min_episodes`` finished episodes, whatever their groups' state."""
    cfg, _ = _run(flow_config, "batching=episodes", "batching.min_episodes=6")
    with _pool(cfg) as pool:
        for version, groups in _trained(pool).items():
            n = sum(len(eps) for eps in groups.values())
            assert n >= 6, (version, n)


def test_c2_groups_trains_only_complete_groups(flow_config: Config) -> None:
    """C2: each update trains at least ``min_groups`` groups, every one complete (all its episodes)."""
    cfg, _ = _run(flow_config, "batching=groups", "batching.min_groups=2")
    with _pool(cfg) as pool:
        for version, groups in _trained(pool).items():
            assert len(groups) >= 2, version
            for gid, rewards in groups.items():
                assert len(rewards) == GROUP, (version, gid)


def test_c3_groups_var_drops_zero_variance_groups(flow_config: Config) -> None:
    """C3: flat groups (every reward equal) were complete in the pool before the first lease, and none was trained."""
    cfg, _ = _run(flow_config, "batching=groups_var", "batching.min_groups=2", "task.name=tests.flows.half_flat_echo")
    with _pool(cfg) as pool:
        trained = _trained(pool)
        for version, groups in trained.items():
            assert len(groups) >= 2, version
            for gid, rewards in groups.items():
                assert len(rewards) == GROUP and statistics.pvariance(rewards.values()) > 0, (version, gid, rewards)
        trained_ids = {gid for groups in trained.values() for gid in groups}
        flat = {gid: eps for gid, eps in _episodes(pool).items()
                if len(eps) == GROUP and len({e.reward for e in eps}) == 1}
        first_lease = _lease_times(pool)[0]
        dropped = [gid for gid, eps in flat.items() if _completed_at(eps) < first_lease]
        assert dropped, "no zero-variance group was complete before the first lease"
        assert not trained_ids & set(flat)


def test_c4_any_agree_fires_on_a_workers_agreement_not_before(flow_config: Config) -> None:
    """C4: the worker agrees after every 2 groups; each update leases only after an agreement was taken,
    although complete groups were waiting earlier (C2 with min_groups=1 would have fired there)."""
    cfg, _ = _run(flow_config, "batching=any_agree", "batching.agree_every=2")
    with _pool(cfg) as pool:
        _trained(pool)
        takes, leases = _takes(pool), _lease_times(pool)
        assert len(takes) == len(leases) == 2, (takes, leases)
        for (taken_at, whose, first_agreed), leased_at in zip(takes, leases, strict=True):
            assert whose and first_agreed <= taken_at <= leased_at
        first_group = min(_completed_at(eps) for eps in _episodes(pool).values() if len(eps) == GROUP)
        # a complete group was waiting before the update fired (C2 with min_groups=1 would have fired then);
        # the agreement itself may be stamped a few ms before that group's last episode is: the worker counts
        # its groups as they finish locally, so compare with the take, which follows the agreement
        assert first_group < takes[0][0], "the update should wait for the agreement, not the first complete group"


@contextmanager
def _second_client(url: str, client_id: str, agree_every: int) -> Iterator[threading.Event]:
    """A second real worker (its own client id, seeds and agreement pace) on the flow's gateway."""
    stop = threading.Event()
    wc = WorkerConfig(server=url, task="echo", workers=2, group_size=GROUP, max_tokens=8, seed=10**9,
                      client_id=client_id, agree_every=agree_every, episode_timeout_s=60)

    def run() -> None:
        # join once the flow's own workers are active (the gateway starts after the model loads): C5 counts
        # the clients active at decision time, so a client that is not there yet cannot be waited for
        while not stop.is_set():
            try:
                if httpx.get(url + "/v1/sync", timeout=2).json()["active_clients"]:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            stop.wait(0.1)
        run_worker(wc, stop)

    t = threading.Thread(target=run, name="second-client", daemon=True)
    t.start()
    try:
        yield stop
    finally:
        stop.set()
        t.join(60)


def test_c5_all_agree_waits_for_every_active_client(flow_config: Config) -> None:
    """C5: the flow's workers agree after every 2 groups, a second client after every group;
    every take holds both clients' agreements, and the first update leased only after the later of the two
    first agreements, although an agreement and complete groups were waiting before."""
    port = free_port()
    with _second_client(f"http://127.0.0.1:{port}", "second-client", agree_every=1):
        cfg, _ = _run(flow_config, "batching=all_agree", "batching.agree_every=2", f"gateway.port={port}")
    with _pool(cfg) as pool:
        _trained(pool)
        takes, leases = _takes(pool), _lease_times(pool)
        assert len(takes) == len(leases) == 2, (takes, leases)
        firsts: dict[str, float] = {}
        for a in pool.agreement_log(limit=100_000):
            firsts.setdefault(a["client_id"], a["created_at"])
        assert "second-client" in firsts and len(firsts) == 2, firsts
        for _, whose, _ in takes:
            assert whose == set(firsts), (whose, firsts)
        for (taken_at, _, _), leased_at in zip(takes, leases, strict=True):
            assert taken_at <= leased_at
        first_group = min(_completed_at(eps) for eps in _episodes(pool).values() if len(eps) == GROUP)
        assert first_group < min(firsts.values()) < max(firsts.values()) <= takes[0][0] <= leases[0]
