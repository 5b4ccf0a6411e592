"""The Curation view's JSON over a real gateway: the trainer's filter from its lease plan (or the labelled default),
with what matches now; saving the form as a curation; the chat-JSONL export."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.gateway import GatewaySettings
from swarm.loop import trainable_filter
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool, StepFilter
from swarm.stack import start_stack

ADMIN = "curation-admin"
AUTH = {"Authorization": f"Bearer {ADMIN}"}


def _play(http: httpx.Client, task: str, group: str, reward: float) -> None:
    ep = http.post("/v1/episodes", json={"task": task, "group_id": group}, headers={}).json()
    key = {"Authorization": f"Bearer {ep['api_key']}"}
    msgs = [{"role": "user", "content": f"{task} {group}"}]
    r = http.post("/v1/chat/completions", json={"model": "default", "messages": msgs}, headers=key)
    assert r.status_code == 200, r.text
    assert http.post(f"/v1/episodes/{ep['episode_id']}/end", json={"reward": reward}, headers=key).status_code == 200


@pytest.fixture
def site(tmp_path: Path) -> Iterator[dict[str, Any]]:
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    stack = start_stack(pool, EchoBackend(), GatewaySettings(admin_token=ADMIN))
    try:
        with httpx.Client(base_url=stack.url, timeout=60, headers=AUTH) as http:
            for g, task in (("m1", "math"), ("m2", "math"), ("c1", "code")):
                for reward in (0.0, 1.0):
                    _play(http, task, g, reward)
            yield {"http": http, "pool": pool}
    finally:
        stack.stop()
        pool.close()


def test_trainer_filter_without_a_plan_is_the_labelled_default(site: dict[str, Any]) -> None:
    http, pool = site["http"], site["pool"]
    d = http.get("/dashboard/api/curation").json()
    want = trainable_filter("default", pool.latest_version("default"), 1)
    assert d["trainer"]["kind"] == "default" and "no trainer of default has published a lease plan" in d["trainer"]["text"]
    assert StepFilter.model_validate(d["trainer_filter"]) == want
    assert d["trainer"]["matching_steps"] == pool.count_steps(want) == 6


def test_trainer_filter_is_the_published_lease_plan_with_its_count(site: dict[str, Any]) -> None:
    http, pool = site["http"], site["pool"]
    saved = http.post("/dashboard/api/curations", json={"name": "maths", "note": "form",
                                                         "filter": {"task": "math", "min_length": "1", "label": ""}})
    assert saved.status_code == 200, saved.text
    assert saved.json()["ref"] == "maths@1" and saved.json()["filter"] == {"task": "math", "min_length": 1}
    assert http.post("/dashboard/api/curations", json={"name": "x", "filter": {}}, headers={"Authorization": ""}
                     ).status_code == 401
    plan = trainable_filter("default", 0, 1, curated=pool.curation("maths").filter, nonzero_variance=True)
    pool.set_lease_plan("default", plan, "maths@1", 0)
    pool.set_lease_plan("other", trainable_filter("other", 0, None), None, 0)
    d = http.get("/dashboard/api/curation").json()
    t = d["trainer"]
    assert (t["kind"], t["policy"], t["curation"], t["policies"]) == ("lease_plan", "default", "maths@1",
                                                                      ["default", "other"])
    assert StepFilter.model_validate(d["trainer_filter"]) == plan
    assert t["matching_steps"] == pool.count_steps(plan) == 4 and not t["matching_capped"]
    assert [c["ref"] for c in d["curations"]] == ["maths@1"]
    other = http.get("/dashboard/api/curation", params={"trainer_policy": "other"}).json()
    assert other["trainer"]["policy"] == "other" and other["trainer"]["matching_steps"] == 0


def test_chat_jsonl_download(site: dict[str, Any]) -> None:
    http = site["http"]
    r = http.post("/dashboard/api/export/jsonl", json={"filter": {"task": "math"}, "min_reward": 0.5})
    assert r.status_code == 200, r.text
    rows = [json.loads(line) for line in r.text.splitlines()]
    assert r.headers["X-Rows"] == "2" and len(rows) == 2
    assert all(row["reward"] == 1.0 and row["messages"][-1]["role"] == "assistant" for row in rows)
    assert http.post("/dashboard/api/export/jsonl", json={"filter": {"tsk": "math"}}).status_code == 400
