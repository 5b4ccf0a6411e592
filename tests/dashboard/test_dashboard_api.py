"""The dashboard's JSON API over a real gateway run (no browser): numbers agree with the pool,
writes need the admin token, bad input is a 4xx, assets are served from the package; reward per
version, rates, roles of a finished multi-agent run; chart axes."""

from __future__ import annotations

import io

import httpx
import polars as pl
import pytest
from populate import ADMIN, GAME_EPISODE_REWARDS, GAME_MIXED, GAME_SEATS, GAME_STEP_MEANS

from swarm.dashboard import svg
from swarm.dashboard.snapshot import summarize
from swarm.pool import StepFilter

AUTH = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture(scope="module")
def http(dash):
    with httpx.Client(base_url=dash["url"], timeout=60, headers=AUTH) as h:  # reads need the admin token too
        yield h


def test_page_and_assets_are_served_locally(http) -> None:
    page = http.get("/dashboard")
    assert page.status_code == 200 and "/dashboard/static/app.js" in page.text
    assert "http" not in page.text.replace("http://www.w3.org", "")  # nothing loaded from elsewhere
    assert http.get("/dashboard/static/app.js").headers["content-type"].startswith(("text/javascript",
                                                                                    "application/javascript"))
    assert http.get("/dashboard/static/style.css").status_code == 200


def test_collection_and_consumption_agree_with_the_pool(http, dash) -> None:
    pool = dash["pool"]
    stats = pool.stats()
    c = http.get("/dashboard/api/collection").json()
    assert c["steps"]["total"] == stats["steps"]["total"]
    assert c["steps"]["by_source"] == stats["steps"]["by_source"]
    assert c["steps"]["by_task"] == stats["steps"]["by_task"]
    assert c["episodes"]["by_status"] == {**{"open": 0, "finished": 0, "abandoned": 0, "failed": 0},
                                          **stats["episodes"]["by_status"]}
    assert sum(c["rates"]["counts"].values()) == stats["steps"]["total"]  # all made in the last 10 min
    assert c["charts"]["rates"].startswith("<svg")
    k = http.get("/dashboard/api/consumption").json()
    assert k["lease_totals"]["acked"] >= 2
    assert k["steps"]["consumed"] == stats["steps"]["consumed"]
    assert sum(k["staleness"].values()) == stats["steps"]["consumed"]
    versions = {v["version"] for v in k["versions"]}
    assert {0, 1, 2} <= versions


def test_steps_pages_details_and_counts(http, dash) -> None:
    pool = dash["pool"]
    page = http.get("/dashboard/api/steps", params={"limit": 5, "task": "echo-demo"}).json()
    assert len(page["data"]) == 5 and page["has_more"]
    newest = pool.query_steps(StepFilter(task="echo-demo"), limit=5, order="-created")
    assert [r["step_id"] for r in page["data"]] == [s.step_id for s in newest]
    d = http.get(f"/dashboard/api/steps/{dash['ids']['whitebox_step']}").json()
    assert d["source"] == "whitebox" and d["response_logprobs"] == [-0.1, -2.3, -0.7]
    assert d["tokens_view"]["response"] == [7, 8, 9] and len(d["episode_steps"]) == 1
    f = {"policy": "default", "reward_status": "final", "consumed": "false"}
    n = http.get("/dashboard/api/count", params=f).json()
    exact = pool.count_steps(StepFilter(**f))
    assert n["steps"] == exact and not n["steps_capped"]
    capped = http.get("/dashboard/api/count", params={**f, "cap": 3}).json()
    assert capped["steps"] == 3 and capped["steps_capped"]


def test_writes_need_the_admin_token(http, dash) -> None:
    sid = dash["ids"]["whitebox_step"]
    body = {"target": "step", "target_ids": [sid], "label": "checked", "note": "api test"}
    anon = {"Authorization": ""}
    assert http.post("/dashboard/api/labels", json=body, headers=anon).status_code == 401
    assert http.post("/dashboard/api/labels", json=body, headers={"Authorization": "Bearer nope"}).status_code == 403
    assert http.post("/dashboard/api/export", json={}, headers=anon).status_code == 401
    assert http.get("/dashboard/api/steps", headers=anon).status_code == 401  # reads too: every prompt is there
    r = http.post("/dashboard/api/labels", json=body, headers=AUTH)
    assert r.status_code == 200 and [lbl.label for lbl in dash["pool"].labels(sid)] == ["checked"]
    r = http.post("/dashboard/api/export", json={"filter": {"source": "whitebox"}}, headers=AUTH)
    assert r.status_code == 200 and r.headers["x-rows"] == "1"
    df = pl.read_parquet(io.BytesIO(r.content))
    assert df["step_id"].to_list() == [sid] and df["response_ids"].to_list() == [[7, 8, 9]]


@pytest.mark.parametrize("path,params", [
    ("/dashboard/api/steps", {"reward_status": "maybe"}),
    ("/dashboard/api/steps", {"limit": "lots"}),
    ("/dashboard/api/steps", {"order": "sideways"}),
    ("/dashboard/api/count", {"max_staleness": "2"}),  # needs current_version
    ("/dashboard/api/collection", {"window_s": "1"}),
])
def test_bad_input_is_a_clear_400(http, path, params) -> None:
    r = http.get(path, params=params)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


def test_unknown_ids_are_404(http) -> None:
    assert http.get("/dashboard/api/steps/step-nope").status_code == 404
    assert http.get("/dashboard/api/merging", params={"group_id": "no-such-group"}).status_code == 404


def test_merging_matches_the_merge_of_the_lease(http, dash) -> None:
    o = http.get("/dashboard/api/merging").json()
    old = http.get("/dashboard/api/optimization").json()  # the view's former name still answers
    assert [b["lease_id"] for b in old["batches"]] == [b["lease_id"] for b in o["batches"]]
    assert {b["lease_id"] for b in o["batches"]} >= set(dash["ids"]["leases"])
    for b in o["batches"]:
        assert b["tree"]["tokens_after"] <= b["timeline"]["tokens_after"] <= b["none"]["tokens_before"]
    tree = o["selected"]["tree"]
    root_children = [n for n in tree["nodes"] if n["parent"] == 0]
    assert sum(n["sequences"] for n in root_children) == o["selected"]["merge"]["steps"]


def test_svg_escapes_text_and_summary_counts_staleness() -> None:
    out = svg.bar_chart(["<script>"], {"a&b": [1.0]}, "t")
    assert "<script>" not in out and "&lt;script&gt;" in out and "a&amp;b" in out
    rows = [{"source": "blackbox", "task": "t", "policy": "p", "version": 0, "consumed": 2, "n": 3, "n_final": 3,
             "reward_sum": 1.5, "tokens": 30},
            {"source": "blackbox", "task": "t", "policy": "p", "version": 1, "consumed": None, "n": 1, "n_final": 0,
             "reward_sum": 0.0, "tokens": 10}]
    s = summarize(rows)
    assert s["steps"]["total"] == 4 and s["steps"]["consumed"] == 3
    assert s["staleness"] == {1: 3}  # leased by version 1 (acked as 2), made by version 0
    assert s["versions"][0]["step_reward_mean"] == 0.5


@pytest.fixture(scope="module")
def fin(finished):
    with httpx.Client(base_url=finished["url"], timeout=60, headers=AUTH) as h:
        yield h


def test_reward_per_version_counts_only_episodes_of_one_version(fin) -> None:
    k = fin.get("/dashboard/api/consumption").json()
    got = {(v["policy"], v["version"]): {t: (e["episodes"], e["reward_mean"]) for t, e in v["episode_rewards"].items()}
           for v in k["versions"] if v["episode_rewards"]}
    assert got.keys() == GAME_EPISODE_REWARDS.keys()
    for key, want in GAME_EPISODE_REWARDS.items():
        assert got[key].keys() == want.keys(), key
        for typ, (n, mean) in want.items():
            assert got[key][typ][0] == n and got[key][typ][1] == pytest.approx(mean), (key, typ)
    assert k["mixed_episodes"] == GAME_MIXED
    steps = {(v["policy"], v["version"]): v["step_reward_mean"] for v in k["versions"]}
    for key, mean in GAME_STEP_MEANS.items():  # what the chart used to show: not the same numbers
        assert steps[key] == pytest.approx(mean) and mean != pytest.approx(GAME_EPISODE_REWARDS[key]["train"][1])
    assert "whose steps were all generated by that policy version" in k["reward_note"]
    assert "2 finished episodes spanning versions are left out" in k["reward_note"]
    chart = k["charts"]["reward"]
    for series in ("default (train)", "default (eval)", "wolf (train)"):  # several episode types: one line each
        assert f'data-series="{series}"' in chart
    assert "every step of the episode" in chart  # the x axis says what a version means here


def test_finished_run_rates_show_its_last_window(fin, finished) -> None:
    c = fin.get("/dashboard/api/collection", params={"window_s": 600}).json()
    assert c["rates"]["live"] is False
    assert c["rates"]["end"] == pytest.approx(finished["t_end"])
    assert sum(c["rates"]["counts"].values()) == finished["steps"]  # the whole run fits in the 10 min window
    assert "no steps yet" not in c["charts"]["rates"] and "<polyline" in c["charts"]["rates"]
    assert "up to the newest step" in c["rates"]["title"]


def test_step_rows_carry_role_and_seat(fin) -> None:
    rows = fin.get("/dashboard/api/steps", params={"task": "werewolves", "limit": 100, "order": "created"}).json()["data"]
    want = [(role, seat) for _, role, seat, _, versions, _, _ in GAME_SEATS for _ in versions]
    assert [(r["role"], r["seat"]) for r in rows] == want


def test_chart_ticks_are_whole_numbers_on_integer_axes() -> None:
    import re

    def ticks(chart: str, cls: str) -> list[str]:
        return re.findall(rf'class="{cls}">([^<]*)</text>', chart)

    bars = svg.bar_chart(["v0", "v1", "v2"], {"steps": [5.0, 3.0, 1.0]}, "t")
    assert ticks(bars, "yt") == ["0", "1", "2", "3", "4", "5"]
    line = svg.line_chart({"p": [(0, -0.49), (1, 0.1), (2, 0.5)]}, "t", time_axis=False, y_min=None, x_integer=True)
    assert ticks(line, "xt") == ["0", "1", "2"]
    assert ticks(line, "yt") == ["-0.6", "-0.4", "-0.2", "0", "0.2", "0.4", "0.6"]
    one = svg.line_chart({"p": [(3, 0.25)]}, "t", time_axis=False, y_min=None, x_integer=True)
    assert ticks(one, "xt") == ["3"]  # a single version: no half or negative versions
    big = svg.line_chart({"a": [(0, 0), (1, 12_345)]}, "t", time_axis=False, y_integer=True)
    assert ticks(big, "yt") == ["0", "2.5k", "5.0k", "7.5k", "10.0k", "12.5k"]
    assert svg.nice_ticks(0, 1, 5, integer=True)[2] == [0, 1]


def test_coinciding_lines_differ_in_dash_marker_and_width() -> None:
    pts = [(1.0, 2.0), (2.0, 5.0), (3.0, 9.0)]
    chart = svg.line_chart({"steps leased": pts, "steps acked": pts}, "t", y_integer=True)
    import re

    lines = re.findall(r'<polyline class="series" data-series="([^"]+)"[^>]*stroke-width="([\d.]+)"'
                       r'(?: stroke-dasharray="([^"]+)")?', chart)
    assert [n for n, _, _ in lines] == ["steps leased", "steps acked"]
    (_, w0, d0), (_, w1, d1) = lines
    assert float(w0) > float(w1) and d0 != d1  # the wide solid line shows around the narrow dashed one
    assert chart.count("<circle") == 3 + 1 and chart.count("<rect") == 3 + 1  # markers per point + legend
    assert chart.count('class="legend-item"') == 2
