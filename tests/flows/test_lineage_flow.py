"""Lineage after a real training flow with eval groups: a consumed step reaches its lease and version, a version its exact steps, and run evals per version match the eval episodes."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict

import httpx
import pytest
import sqlalchemy as sa

from flows.train import train_flow
from swarm.app import GatewaySettings, create_app
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool, StepFilter
from swarm.pool.evals import record_run_evals, run_eval_id
from swarm.pool.schema import steps as S
from swarm.stack import ServerThread

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.slow]


def _expected_evals(pool: Pool) -> dict[int, tuple[int, float, float]]:
    """From the episodes themselves: per version, the finished eval episodes played entirely by that
    version: (count, mean reward, when the last one ended)."""
    by: dict[int, list[tuple[float | None, float]]] = defaultdict(list)
    for e in pool.query_episodes(StepFilter(episode_type="eval", episode_status="finished"), limit=10_000):
        versions = {(s.policy, s.policy_version) for s in pool.query_steps(StepFilter(episode_id=e.episode_id))}
        if len(versions) == 1:
            by[next(iter(versions))[1]].append((e.reward, e.ended_at or 0.0))
    return {v: (len(rs), statistics.fmean(r for r, _ in rs if r is not None), max(t for _, t in rs))
            for v, rs in by.items()}


def test_lineage_of_a_real_run(flow_config) -> None:
    cfg = flow_config("train.updates=3", "batching.min_groups=2", "task.eval_every=2")
    summary_start = time.time()
    summary = train_flow(cfg)
    assert summary["status"] == "FINISHED" and summary["updates"] == 3
    pool = Pool(cfg["pool"]["url"])
    server = ServerThread(create_app(pool, EchoBackend(), GatewaySettings())).start()
    try:
        with pool.engine.connect() as c:
            consumed = {r.step_id: (r.lease_id, r.consumed_version) for r in c.execute(
                sa.select(S.c.step_id, S.c.lease_id, S.c.consumed_version).where(S.c.consumed_version.is_not(None)))}
        by_version: dict[int, set[str]] = defaultdict(set)
        for sid, (_, v) in consumed.items():
            by_version[v].add(sid)
        assert sorted(by_version) == [1, 2, 3]
        with httpx.Client(base_url=server.url, timeout=60) as h:
            # forward from a consumed step of each update: its lease, the version it made, that version's record
            for v, ids in by_version.items():
                sid = sorted(ids)[0]
                d = h.get(f"/v1/pool/lineage/steps/{sid}").json()
                assert d["lease"]["lease_id"] == consumed[sid][0] and d["lease"]["state"] == "acked"
                assert d["update"]["consumed_version"] == v and d["update"]["version"]["version"] == v
                assert d["step"]["policy_version"] <= v - 1  # generated before the trainer made v
                # back from the version: exactly the steps whose consumed_version is it
                back = h.get(f"/v1/pool/lineage/versions/default/{v}", params={"limit": 1000}).json()
                assert {s["step_id"] for s in back["steps"]["data"]} == ids and back["made_of"]["steps"] == len(ids)
                assert back["record"]["version"] == v
            # eval results recorded per version by the flow equal what the eval episodes say: one row per
            # version, over all its eval episodes that had ended when the flow last recorded
            rows = pool.eval_results("default")
            assert rows and all(r.source == "run" and r.metadata.get("mlflow_run_id") == summary["run_id"]
                                and r.eval_id == run_eval_id("default", r.version, r.task) for r in rows)
            want = _expected_evals(pool)
            last = max(r.metadata["upto"] for r in rows)
            got = {r.version: (r.episodes, r.reward) for r in rows}
            assert len(got) == len(rows) and set(got) <= set(want)
            for v, (n, mean, ended) in want.items():
                if ended < last - 1.0:  # done before the flow's last record (1 s for a late commit)
                    assert got[v][0] == n and got[v][1] == pytest.approx(mean), (v, got, want)
                else:
                    assert got.get(v, (0, None))[0] <= n
            # recording again after the run (what the next update would do) catches up exactly
            record_run_evals(pool, summary_start, ["default"], {"mlflow_run_id": summary["run_id"]})
            rows = pool.eval_results("default")
            assert {r.version: (r.episodes, pytest.approx(r.reward)) for r in rows} == {
                v: (n, mean) for v, (n, mean, _) in want.items()}
            api = h.get("/v1/pool/evals", params={"policy": "default"}).json()
            assert len(api["data"]) == len(rows)
            some = rows[0]
            assert h.get(f"/v1/pool/lineage/versions/default/{some.version}").json()["evals"]["summary"][0][
                "episodes"] == some.episodes
    finally:
        server.stop()
        pool.close()
