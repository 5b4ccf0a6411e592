"""Pool read API, leases (lease -> ack) and labels over HTTP, with one step shape throughout."""

from __future__ import annotations

from typing import Any

STEP_KEYS = {"step_id", "episode_id", "index", "parent_step_id", "policy", "policy_version", "reward",
             "reward_status", "prompt_ids", "response_ids", "response_logprobs", "group_id", "task", "source"}


def _play(gw: Any, task: str, group: str, reward: float) -> dict[str, Any]:
    ep = gw.episode(task=task, group_id=group)
    msgs = [{"role": "user", "content": f"{task} go"}]
    for k in range(2):
        r = gw.chat(ep["api_key"], msgs).json()
        msgs += [r["choices"][0]["message"], {"role": "user", "content": f"t{k}"}]
    assert gw.post(f"/v1/episodes/{ep['episode_id']}/end", ep["api_key"], json={"reward": reward}).status_code == 200
    return ep


def test_read_api_filters_and_step_shape(gateway: Any) -> None:
    a = _play(gateway, "math", "g1", 1.0)
    _play(gateway, "code", "g2", 0.0)
    r = gateway.http.get("/v1/pool/steps", params={"task": "math", "reward_status": "final",
                                                    "episode_status": "finished"})
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["total"] == 2 and len(data["data"]) == 2
    step = data["data"][0]
    assert STEP_KEYS <= set(step) and step["prompt_ids"] is None and step["reward"] == 1.0
    full = gateway.http.get(f"/v1/pool/steps/{step['step_id']}").json()
    assert set(full) == set(step) and full["prompt_ids"] and len(full["response_ids"]) == len(full["response_logprobs"])
    with_tokens = gateway.http.get("/v1/pool/steps", params={"episode_id": a["episode_id"], "with_tokens": "true",
                                                              "limit": 1, "offset": 1}).json()
    assert with_tokens["data"][0]["index"] == 1 and with_tokens["data"][0]["prompt_ids"]
    assert gateway.http.get("/v1/pool/steps", params={"metadata": '{"kind": "chat"}'}).json()["total"] == 4
    eps = gateway.http.get("/v1/pool/episodes", params={"task": "code"}).json()["data"]
    assert [e["task"] for e in eps] == ["code"] and eps[0]["status"] == "finished"
    assert gateway.http.get(f"/v1/pool/episodes/{a['episode_id']}").json()["reward"] == 1.0
    stats = gateway.http.get("/v1/pool/stats").json()
    assert stats["steps"]["total"] == 4 and stats["episodes"]["total"] == 2


def test_lease_ack_and_labels_with_admin_token(make_gateway: Any) -> None:
    gw = make_gateway(admin_token="adm")
    _play(gw, "math", "g1", 1.0)
    _play(gw, "math", "g1", 0.0)
    excluded = _play(gw, "math", "g2", 0.5)
    lbl = gw.post("/v1/pool/labels", "adm", json={"target": "episode", "target_id": excluded["episode_id"],
                                                  "label": "broken", "exclude": True, "note": "tool crashed"})
    assert lbl.status_code == 200 and lbl.json()["exclude"] is True
    flt = {"policy": "default", "reward_status": "final", "episode_status": "finished", "consumed": False}
    r = gw.post("/v1/pool/leases", "adm", json={"filter": flt, "max_groups": 4, "ttl_s": 30})
    assert r.status_code == 200, r.text
    lease = r.json()
    assert lease["group_ids"] == ["g1"] and len(lease["steps"]) == 4
    s = lease["steps"][0]
    assert STEP_KEYS <= set(s) and s["prompt_ids"] and len(s["response_ids"]) == len(s["response_logprobs"])
    again = gw.post("/v1/pool/leases", "adm", json={"filter": flt, "max_steps": 10}).json()
    assert again["steps"] == []  # leased steps are not handed out twice
    r = gw.post(f"/v1/pool/leases/{lease['lease_id']}/ack", "adm", json={"consumed_version": 1})
    assert r.status_code == 200 and r.json()["acked"] == 4
    assert gw.post(f"/v1/pool/leases/{lease['lease_id']}/ack", "adm", json={"consumed_version": 1}).status_code == 409
    assert gw.http.get("/v1/pool/steps").status_code == 401  # pool reads need the admin token once it is set
    consumed = gw.http.get("/v1/pool/steps", params={"consumed": "true"}, headers={"Authorization": "Bearer adm"}).json()
    assert consumed["total"] == 4
