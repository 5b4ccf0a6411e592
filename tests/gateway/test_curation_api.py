"""Curations and lease plans over HTTP (real gateway): save, version, load, list, errors in OpenAI's shape."""

from __future__ import annotations

from typing import Any

from swarm.loop import trainable_filter
from swarm.pool import StepFilter


def _error(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert {"message", "type"} <= set(err)
    return err


def test_save_version_load_and_list(make_gateway: Any) -> None:
    gw = make_gateway(admin_token="adm")
    body = {"name": "clean", "filter": {"task": "math", "label": "gold"}, "note": "first cut"}
    r = gw.post("/v1/pool/curations", "adm", json=body)
    assert r.status_code == 200, r.text
    assert r.json() | {"created_at": 0} == {"object": "curation", "name": "clean", "version": 1, "ref": "clean@1",
                                            "filter": {"task": "math", "label": "gold"}, "note": "first cut",
                                            "created_at": 0}
    assert gw.post("/v1/pool/curations", "adm", json=body).json()["version"] == 1  # unchanged: no new version
    v2 = gw.post("/v1/pool/curations", "adm", json={**body, "filter": {"task": "math", "min_length": 10}}).json()
    assert v2["version"] == 2
    auth = {"Authorization": "Bearer adm"}
    assert gw.http.get("/v1/pool/curations/clean", headers=auth).json()["version"] == 2
    assert gw.http.get("/v1/pool/curations/clean", params={"version": 1}, headers=auth).json()["filter"] == body["filter"]
    assert gw.http.get("/v1/pool/curations/clean@1", headers=auth).json()["note"] == "first cut"
    listed = gw.http.get("/v1/pool/curations", headers=auth).json()["data"]
    assert [(c["name"], c["version"]) for c in listed] == [("clean", 2)]
    assert gw.pool.curation("clean", 2).filter == StepFilter(task="math", min_length=10)


def test_errors_and_auth(make_gateway: Any) -> None:
    gw = make_gateway(admin_token="adm")
    auth = {"Authorization": "Bearer adm"}
    ok = {"name": "x", "filter": {}}
    assert _error(gw.post("/v1/pool/curations", None, json=ok), 401)
    assert _error(gw.post("/v1/pool/curations", "wrong", json=ok), 403)
    assert "tsk" in str(_error(gw.post("/v1/pool/curations", "adm", json={"name": "x", "filter": {"tsk": "m"}}),
                               400))
    assert _error(gw.post("/v1/pool/curations", "adm", json={"name": "", "filter": {}}), 400)
    assert "'@'" in _error(gw.post("/v1/pool/curations", "adm", json={"name": "a@b", "filter": {}}), 400)["message"]
    gw.post("/v1/pool/curations", "adm", json=ok)
    assert "known: x" in _error(gw.http.get("/v1/pool/curations/nope", headers=auth), 404)["message"]
    assert "no version 5" in _error(gw.http.get("/v1/pool/curations/x", params={"version": 5}, headers=auth),
                                    404)["message"]
    assert _error(gw.http.get("/v1/pool/curations/x", params={"version": "two"}, headers=auth), 400)
    assert _error(gw.http.get("/v1/pool/curations", headers={}), 401)


def test_lease_plans_show_the_trainers_filter(make_gateway: Any) -> None:
    gw = make_gateway(admin_token="adm")
    auth = {"Authorization": "Bearer adm"}
    assert gw.http.get("/v1/pool/lease_plans", headers=auth).json()["data"] == []
    f = trainable_filter("default", 3, 1, curated=StepFilter(label="gold"), nonzero_variance=True)
    gw.pool.set_lease_plan("default", f, "gold@1", 3)
    (plan,) = gw.http.get("/v1/pool/lease_plans", headers=auth).json()["data"]
    assert plan["policy"] == "default" and plan["curation"] == "gold@1" and plan["version"] == 3
    assert StepFilter.model_validate(plan["filter"]) == f
