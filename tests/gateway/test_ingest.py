"""White-box steps (multi-MB bodies, idempotent retries), events / feedback / late rewards, abandon sweep."""

from __future__ import annotations

import json
import time
from typing import Any

from swarm.pool import StepFilter


def test_whitebox_steps_of_several_megabytes(gateway: Any) -> None:
    ep = gateway.episode()
    n = 800_000
    prompt = [(i * 7919) % 150_000 for i in range(n)]
    steps = [
        {"step_id": "step-wb-1", "prompt_ids": prompt, "response_ids": [5, 6, 7], "response_logprobs": [-0.5, -1.0, -0.1],
         "prompt_messages": [{"role": "user", "content": "long"}], "response_text": "abc", "reward": 0.5,
         "policy": "some-frozen-model", "policy_version": 3, "metadata": {"k": "v"}},
        {"prompt_ids": [1, 2], "response_ids": [3], "response_logprobs": None, "parent_step_id": "step-wb-1"},
    ]
    body = json.dumps({"steps": steps}).encode()
    assert len(body) > 5_000_000
    r = gateway.post("/v1/steps", ep["api_key"], content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    ids = r.json()["step_ids"]
    assert ids[0] == "step-wb-1" and len(ids) == 2
    s = gateway.pool.get_step("step-wb-1")
    assert s.prompt_ids == prompt and s.response_ids == [5, 6, 7] and s.policy == "some-frozen-model"
    assert s.source.value == "whitebox" and s.index == 0 and s.reward == 0.5 and s.reward_status.value == "pending"
    assert gateway.pool.get_step(ids[1]).index == 1
    # a retry of the same submission is a no-op
    r = gateway.post("/v1/steps", ep["api_key"], json={"steps": [{"step_id": "step-wb-1", "prompt_ids": [1],
                                                                  "response_ids": [2]}]})
    assert r.status_code == 200 and r.json()["step_ids"] == ["step-wb-1"]
    assert gateway.pool.count_steps(StepFilter(episode_id=ep["episode_id"])) == 2
    # the read API gives it back with tokens
    got = gateway.http.get("/v1/pool/steps/step-wb-1").json()
    assert got["prompt_ids"] == prompt and got["response_logprobs"] == [-0.5, -1.0, -0.1]


def test_events_feedback_and_late_rewards(gateway: Any) -> None:
    ep = gateway.episode()
    key, eid = ep["api_key"], ep["episode_id"]
    r = gateway.chat(key, [{"role": "user", "content": "a"}]).json()
    step_id, response_id = r["swarm"]["step_id"], r["id"]
    assert gateway.post("/v1/events", key, json={"episode_id": eid, "name": "tool_used", "payload": {"t": 1}}).status_code == 200
    assert gateway.post(f"/v1/episodes/{eid}/end", key, json={"status": "finished"}).status_code == 200
    assert gateway.pool.get_episode(eid).reward_status.value == "pending"
    # after the end: a judge's reward on the episode (with the episode's own key), negative is fine
    r = gateway.post("/v1/events", key, json={"kind": "reward", "episode_id": eid, "value": -0.25, "name": "judge"})
    assert r.status_code == 200, r.text
    ep_now = gateway.pool.get_episode(eid)
    assert ep_now.reward == -0.25 and ep_now.reward_status.value == "final"
    # a human rates the response by its chat completion id, with a step reward
    r = gateway.post("/v1/feedback", key, json={"response_id": response_id, "rating": 4, "correction": "b",
                                                "reward": 0.75})
    assert r.status_code == 200 and r.json()["step_id"] == step_id
    # the judge's final reward already reached the step: the late one is history, not an overwrite
    assert r.json()["reward_applied"] is False
    step = gateway.pool.get_step(step_id, with_tokens=False)
    assert step.reward == -0.25 and step.reward_status.value == "final"
    kinds = sorted(e.kind for e in gateway.pool.events(episode_id=eid))
    assert kinds == ["event", "feedback", "reward"]
    fb = [e for e in gateway.pool.events(episode_id=eid) if e.kind == "feedback"][0]
    assert fb.rating == 4 and fb.correction == "b" and fb.value == 0.75


def test_idle_episodes_are_abandoned_and_keep_their_steps(make_gateway: Any) -> None:
    gw = make_gateway(sweep_interval_s=0.1)
    idle, busy = gw.episode(timeout_s=0.6), gw.episode(timeout_s=0.6)
    assert gw.chat(idle["api_key"], [{"role": "user", "content": "x"}]).status_code == 200
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert gw.post(f"/v1/episodes/{busy['episode_id']}/heartbeat", busy["api_key"]).status_code == 200
        if gw.pool.get_episode(idle["episode_id"]).status.value == "abandoned":
            break
        time.sleep(0.1)
    assert gw.pool.get_episode(idle["episode_id"]).status.value == "abandoned"
    assert gw.pool.get_episode(busy["episode_id"]).status.value == "open"
    assert gw.pool.count_steps(StepFilter(episode_id=idle["episode_id"])) == 1
    r = gw.chat(idle["api_key"], [{"role": "user", "content": "x"}])
    assert r.status_code == 403 and r.json()["error"]["code"] == "episode_ended"
