"""The dashboard shows and filters by the task code version a worker tagged each episode with (#33)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.client import SwarmClient, WorkerConfig, run_worker
from swarm.client.task import load_task
from swarm.gateway import GatewaySettings
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool, StepFilter
from swarm.stack import start_stack


@pytest.fixture(scope="module")
def tagged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A gateway whose pool holds a worker's echo episodes (tagged) and two SDK episodes (untagged)."""
    d = tmp_path_factory.mktemp("codever")
    pool = Pool(f"sqlite:///{d / 'pool.db'}")
    stack = start_stack(pool, EchoBackend(), GatewaySettings())
    try:
        run_worker(WorkerConfig(server=stack.url, task="echo", workers=2, group_size=2, max_groups=2, seed=5))
        with SwarmClient(stack.url) as client:
            for _ in range(2):
                with client.episode(task="echo", group_id="plain") as ep:
                    ep.openai().chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}],
                                                        max_tokens=4)
                    ep.end(reward=0.5)
        with httpx.Client(base_url=stack.url, timeout=60) as http:
            yield {"http": http, "pool": pool, "version": load_task("echo").code_version}
    finally:
        stack.stop()
        pool.close()


def test_steps_count_and_export_filter_on_the_code_version(tagged: dict[str, Any], tmp_path: Path) -> None:
    http, pool, v = tagged["http"], tagged["pool"], tagged["version"]
    want = {s.step_id for s in pool.query_steps(StepFilter(metadata={"code_version": v}), limit=1000)}
    assert len(want) == 4  # the worker's 2 groups x 2 episodes, one step each; not the SDK's two
    rows = http.get("/dashboard/api/steps", params={"code_version": v, "limit": 100}).json()["data"]
    assert {r["step_id"] for r in rows} == want and {r["code_version"] for r in rows} == {v}
    every = http.get("/dashboard/api/steps", params={"limit": 100}).json()["data"]
    assert sorted((r["code_version"] or "") for r in every) == ["", ""] + [v] * 4
    n = http.get("/dashboard/api/count", params={"code_version": v, "exact": "true"}).json()
    assert n["steps"] == 4 and n["episodes"] == 4 and n["filter"]["metadata"] == {"code_version": v}
    assert http.get("/dashboard/api/count", params={"code_version": "0" * 12}).json()["steps"] == 0
    # with another metadata condition (a JSON string, as the query string gives it) both apply
    both = http.get("/dashboard/api/count", params={"code_version": v, "metadata": '{"seed": 5}'}).json()
    assert both["steps"] == 2 and both["filter"]["metadata"] == {"seed": 5, "code_version": v}
    export = http.post("/dashboard/api/export", json={"filter": {"code_version": v}, "with_tokens": False})
    assert export.status_code == 200 and export.headers["X-Rows"] == "4"


def test_episode_views_show_the_code_version(tagged: dict[str, Any]) -> None:
    http, v = tagged["http"], tagged["version"]
    recent = http.get("/dashboard/api/collection").json()["recent_episodes"]
    assert sorted((e["code_version"] or "") for e in recent) == ["", ""] + [v] * 4
    row = http.get("/dashboard/api/steps", params={"code_version": v, "limit": 1}).json()["data"][0]
    detail = http.get(f"/dashboard/api/steps/{row['step_id']}").json()
    assert detail["episode"]["metadata"]["code_version"] == v
    page = http.get("/dashboard").text
    assert page.count('name="code_version"') == 2  # the step view's filter and the curation filter
