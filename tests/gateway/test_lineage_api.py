"""Lineage and eval-results API on a real gateway: step -> lease -> consuming version -> evals, version -> its steps, auth, 404s."""

from __future__ import annotations

from typing import Any

from swarm.pool.evals import record_run_evals
from swarm.records import PolicyVersion, now

ADM = {"Authorization": "Bearer adm"}


def _play(gw: Any, group: str, reward: float, type: str = "train") -> tuple[dict[str, Any], list[str]]:
    ep = gw.episode(task="math", group_id=group, type=type, metadata={"metrics": {"win": reward}})
    r = gw.chat(ep["api_key"], [{"role": "user", "content": f"{group} go"}])
    assert r.status_code == 200, r.text
    assert gw.post(f"/v1/episodes/{ep['episode_id']}/end", ep["api_key"], json={"reward": reward}).status_code == 200
    return ep, [r.json()["id"]]


def test_lineage_routes_trace_a_step_and_a_version(make_gateway: Any) -> None:
    gw = make_gateway(admin_token="adm")
    since = now() - 1
    responses = []
    for rw in (1.0, 0.0):
        responses += _play(gw, "g1", rw)[1]
    _play(gw, "g2", 0.5)  # recorded, never leased
    flt = {"policy": "default", "group_id": "g1", "reward_status": "final", "episode_status": "finished",
           "consumed": False}
    lease = gw.post("/v1/pool/leases", "adm", json={"filter": flt, "max_groups": 4}).json()
    leased = {s["step_id"] for s in lease["steps"]}
    assert len(leased) == 2
    assert gw.post(f"/v1/pool/leases/{lease['lease_id']}/ack", "adm", json={"consumed_version": 1}).status_code == 200
    gw.pool.add_policy_version(PolicyVersion(policy="default", version=1, adapter_path="/ckpt/v1"))
    _play(gw, "e1", 1.0, type="eval")  # played by version 0 (the echo backend serves version 0)
    assert [(r.version, r.episodes) for r in record_run_evals(gw.pool, since, ["default"])] == [(0, 1)]
    gw.pool.add_eval_result({"policy": "default", "version": 1, "task": "math", "episodes": 2, "reward": 0.25,
                             "source": "pinned"})

    sid = sorted(leased)[0]
    assert gw.http.get(f"/v1/pool/lineage/steps/{sid}").status_code == 401  # reads need the admin token
    r = gw.http.get(f"/v1/pool/lineage/steps/{sid}", headers=ADM)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["step"]["response_id"] in responses and d["step"]["policy_version"] == 0
    assert d["lease"]["lease_id"] == lease["lease_id"] and d["lease"]["state"] == "acked"
    assert d["update"]["consumed_version"] == 1 and d["update"]["version"]["adapter_path"] == "/ckpt/v1"
    assert [h["source"] for h in d["episode"]["reward_history"]] in ([], ["agent"])
    assert len(d["group"]["members"]) == 2
    assert [(e["source"], e["episodes"]) for e in d["evals"]["rows"]] == [("pinned", 2)]

    v = gw.http.get("/v1/pool/lineage/versions/default/1", headers=ADM, params={"limit": 10}).json()
    assert {s["step_id"] for s in v["steps"]["data"]} == leased and v["steps"]["total"] == 2
    assert [ls["lease_id"] for ls in v["leases"]] == [lease["lease_id"]]
    assert v["made_of"]["groups"] == 1 and v["made_of"]["staleness"] == {"0": 2}
    v0 = gw.http.get("/v1/pool/lineage/versions/default/0", headers=ADM).json()
    assert v0["generated"]["steps"] == 4 and v0["evals"]["summary"][0]["metrics"] == {"win": 1.0}

    ev = gw.http.get("/v1/pool/evals", headers=ADM, params={"policy": "default"}).json()
    assert [(e["version"], e["source"]) for e in ev["data"]] == [(0, "run"), (1, "pinned")]
    assert gw.http.get("/v1/pool/evals", headers=ADM, params={"version": 1}).json()["summary"][0]["reward"] == 0.25

    for path in ("/v1/pool/lineage/steps/nope", "/v1/pool/lineage/versions/default/7",
                 "/v1/pool/lineage/versions/other/1"):
        r = gw.http.get(path, headers=ADM)
        assert r.status_code == 404, path
        assert set(r.json()["error"]) >= {"type", "message"}
    assert gw.http.get("/v1/pool/lineage/versions/default/x", headers=ADM).status_code in (400, 422)
