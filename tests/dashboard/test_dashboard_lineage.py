"""The dashboard's Lineage API over a real gateway run (no browser): step -> lease -> version, version -> exactly its steps, feedback, eval chart, auth, 404."""

from __future__ import annotations

import httpx
import pytest
import sqlalchemy as sa
from populate import ADMIN

from swarm.pool.schema import steps as S

AUTH = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def http(dash):
    with httpx.Client(base_url=dash["url"], timeout=60, headers=AUTH) as h:
        yield h


def _consumed_by(pool, version: int) -> set[str]:
    with pool.engine.connect() as c:
        return set(c.execute(sa.select(S.c.step_id).where(S.c.consumed_version == version)).scalars())


def test_page_has_the_lineage_view(http) -> None:
    page = http.get("/dashboard").text
    assert 'data-view="lineage"' in page and 'id="view-lineage"' in page and "/dashboard/static/lineage.js" in page
    assert http.get("/dashboard/static/lineage.js").status_code == 200


def test_version_back_to_its_steps_and_step_forward_to_its_version(http, dash) -> None:
    pool, leases = dash["pool"], dash["ids"]["leases"]
    versions = http.get("/dashboard/api/lineage/versions").json()["data"]
    assert {(v["policy"], v["version"]) for v in versions} >= {("default", 1), ("default", 2)}
    pool.add_eval_result({"policy": "default", "version": 1, "task": "echo-demo", "episodes": 3, "reward": 0.4,
                          "metrics": {"win": 0.5}})
    for version, lease_id in ((1, leases[0]), (2, leases[1])):
        want = _consumed_by(pool, version)
        d = http.get(f"/dashboard/api/lineage/versions/default/{version}", params={"limit": 500}).json()
        assert {s["step_id"] for s in d["steps"]["data"]} == want and d["made_of"]["steps"] == len(want)
        assert [ls["lease_id"] for ls in d["leases"]] == [lease_id]
        assert sum(d["made_of"]["tasks"].values()) == len(want)
        assert d["chart"].startswith("<svg")
        step = http.get(f"/dashboard/api/lineage/steps/{sorted(want)[0]}").json()
        assert step["lease"]["lease_id"] == lease_id and step["update"]["consumed_version"] == version
        assert step["episode"]["episode_id"] == step["step"]["episode_id"]
        assert any(m["episode_id"] == step["episode"]["episode_id"] for m in step["group"]["members"])
    v1 = http.get("/dashboard/api/lineage/versions/default/1").json()
    assert v1["evals"]["summary"][0]["metrics"] == {"win": 0.5} and "echo-demo win" in v1["chart"]
    assert v1["steps"]["total"] == len(_consumed_by(pool, 1)) and len(v1["steps"]["data"]) <= 25


def test_feedback_and_reward_history_show_on_the_chain(http, dash) -> None:
    d = http.get(f"/dashboard/api/lineage/steps/{dash['ids']['whitebox_step']}").json()
    assert [f["rating"] for f in d["episode"]["feedback"]] == [0.9]
    assert d["update"] is None and d["lease"] is None  # never leased: the chain stops at the group


def test_lineage_reads_need_the_token_and_unknowns_are_404(dash) -> None:
    with httpx.Client(base_url=dash["url"], timeout=30) as anon:
        assert anon.get("/dashboard/api/lineage/versions").status_code == 401
    with httpx.Client(base_url=dash["url"], timeout=30, headers=AUTH) as h:
        r = h.get("/dashboard/api/lineage/steps/nope")
        assert r.status_code == 404 and set(r.json()["error"]) >= {"type", "message"}
        assert h.get("/dashboard/api/lineage/versions/default/99").status_code == 404
        assert h.get("/dashboard/api/lineage/versions/default/-1").status_code in (400, 422)
