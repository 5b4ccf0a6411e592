"""The dashboard in a real headless Chromium over a real gateway run: every view renders the
pool's data, updates live, a label made in the UI changes what a lease returns, no console errors;
over a finished multi-agent run: last window of step rates, role / seat column, honest reward per
version; chart axes readable (whole-number ticks where whole, no clipped or repeated labels)."""

from __future__ import annotations

import re

import httpx
import polars as pl
import pytest
from populate import ADMIN, GAME_SEATS, run_groups

from swarm.pool import StepFilter

pytestmark = pytest.mark.browser


def _num(text: str) -> int:
    return int(re.sub(r"[^\d]", "", text))


# every text of the visible view's charts inside its viewBox; per chart, tick labels not repeated and
# x tick labels not overlapping
CHART_PROBLEMS = """() => {
  const bad = [];
  for (const svg of document.querySelectorAll('.view:not([hidden]) svg.chart')) {
    const vb = svg.viewBox.baseVal, name = svg.getAttribute('aria-label');
    for (const t of svg.querySelectorAll('text')) {
      const b = t.getBBox();
      if (b.x < -0.5 || b.y < -0.5 || b.x + b.width > vb.width + 0.5 || b.y + b.height > vb.height + 0.5)
        bad.push(`${name}: '${t.textContent}' clipped`);
    }
    for (const cls of ['xt', 'yt']) {
      const ts = [...svg.querySelectorAll('text.' + cls)];
      const labels = ts.map((t) => t.textContent);
      if (new Set(labels).size !== labels.length) bad.push(`${name}: repeated ${cls} labels ${labels}`);
      if (cls === 'xt') {
        const boxes = ts.map((t) => t.getBBox()).sort((a, b) => a.x - b.x);
        for (let i = 1; i < boxes.length; i++)
          if (boxes[i].x < boxes[i - 1].x + boxes[i - 1].width) bad.push(`${name}: x labels overlap ${labels}`);
      }
    }
  }
  return bad;
}"""


def _ticks(p, box: str, cls: str) -> list[str]:
    return p.eval_on_selector_all(f"{box} svg text.{cls}", "els => els.map(e => e.textContent)")


def _whole(labels: list[str]) -> bool:
    return bool(labels) and all(re.fullmatch(r"v?-?\d+(\.0)?k?", s) for s in labels)


def test_every_view_renders_pool_data(dash, open_page) -> None:
    pool = dash["pool"]
    pg = open_page(dash["url"])

    p = pg.view("collection")
    stats = pool.stats()
    assert _num(p.inner_text("#col-cards [data-key='steps'] .v")) == stats["steps"]["total"]
    assert _num(p.inner_text("#col-cards [data-key='failed'] .v")) == 1
    assert _num(p.inner_text("#col-cards [data-key='open'] .v")) == 1
    assert p.locator("#col-rates svg polyline, #col-rates svg circle").count() > 0
    for src in ("blackbox", "whitebox"):
        assert src in p.inner_text("#col-source")
    assert "worker-c" in p.inner_text("#col-clients")

    p = pg.view("representation")
    assert p.locator("#rep-table tbody tr").count() >= 20
    # a second-turn black-box step: prefix-consistent, response highlighted, logprobs coloured
    second = pool.query_steps(StepFilter(task="echo-demo", group_id="echo-1-0"), limit=50)
    step = next(s for s in second if s.index == 1)
    p.fill("#rep-filter input[name=episode_id]", step.episode_id)
    p.wait_for_function("document.querySelectorAll('#rep-table tbody tr').length === 2")
    p.locator("#rep-table tbody tr", has_text=" #1").click()
    p.wait_for_selector(f"#rep-step dd:has-text('{step.step_id}')")
    full = pool.get_step(step.step_id)
    assert p.locator("#rep-tokens .tok.r").count() == len(full.response_ids)
    assert p.locator("#rep-tokens .tok.p").count() == len(full.prompt_ids)
    assert p.locator("#rep-tokens .tok.r[data-lp]").count() == len(full.response_ids)
    assert "yes" in p.inner_text("#rep-prefix")
    assert p.locator("#rep-step table tbody tr").count() == 2  # the episode's steps
    assert step.step_id in p.inner_text("#rep-step")

    p = pg.view("curation")
    p.click("#cur-trainer")
    p.wait_for_function("document.querySelector('#cur-filter [name=reward_status]').value === 'final'")
    trainer = StepFilter.trainable("default", max_staleness=1, current_version=pool.latest_version("default"))
    want = pool.count_steps(trainer)
    p.wait_for_function(f"document.querySelector(\"#cur-cards [data-key='matching steps'] .v\").textContent === '{want}'")

    p = pg.view("merging")
    assert p.locator("#mrg-batches tbody tr").count() == 2
    assert p.locator("#mrg-icicle svg rect").count() >= 2
    assert "tree" in p.inner_text("#mrg-selected")

    p = pg.view("consumption")
    assert _num(p.inner_text("#con-cards [data-key='leases acked'] .v")) == 2
    assert _num(p.inner_text("#con-cards [data-key='steps consumed'] .v")) == stats["steps"]["consumed"]
    assert p.locator("#con-reward svg circle").count() >= 3  # versions 0, 1, 2
    assert p.locator("#con-staleness svg rect").count() >= 1
    assert p.locator("#con-leases svg polyline").count() == 2
    for box in ("#con-leases", "#con-consumed", "#con-generated", "#con-staleness"):  # counts
        assert _whole(_ticks(p, box, "yt")), (box, _ticks(p, box, "yt"))
    assert _whole(_ticks(p, "#con-reward", "xt")), _ticks(p, "#con-reward", "xt")  # versions
    assert p.evaluate(CHART_PROBLEMS) == []
    assert pg.errors == []


def test_coinciding_lease_lines_show_as_two(dash, open_page) -> None:
    """Every lease of this run is acked, so 'steps leased' and 'steps acked' are the same line."""
    pg = open_page(dash["url"])
    p = pg.view("consumption")
    lines = p.eval_on_selector_all("#con-leases svg polyline.series", """els => els.map(e => ({
        name: e.dataset.series, points: e.getAttribute('points'), width: Number(e.getAttribute('stroke-width')),
        dash: e.getAttribute('stroke-dasharray') || '', colour: e.getAttribute('stroke')}))""")
    assert [ln["name"] for ln in lines] == ["steps leased", "steps acked"]
    leased, acked = lines
    assert leased["points"] == acked["points"]  # they coincide ...
    # ... and still show as two: the first is wider (its colour shows on both sides), the second dashed
    assert leased["width"] > acked["width"] + 1 and acked["dash"] and not leased["dash"]
    assert leased["colour"] != acked["colour"]
    legend = p.eval_on_selector_all("#con-leases svg .legend-item", "els => els.map(e => e.dataset.series)")
    assert legend == ["steps leased", "steps acked"]
    assert p.locator("#con-leases svg .legend-item line[stroke-dasharray]").count() == 1
    assert pg.errors == []


def test_prefix_merging_view_and_its_old_link(dash, open_page) -> None:
    pg = open_page(dash["url"])
    p = pg.page
    p.goto(f"{dash['url']}/dashboard#optimization")  # links to the former name land on the renamed view
    p.wait_for_selector("body[data-loaded='merging']", timeout=20_000)
    assert p.evaluate("location.hash") == "#merging"
    assert p.inner_text("#tabs a.active") == "Prefix merging"
    assert "Optimization" not in p.inner_text("#tabs")
    assert p.locator("#mrg-batches tbody tr").count() == 2
    assert pg.errors == []


def test_finished_multi_agent_run(finished, open_page) -> None:
    """A werewolves-like run that ended 3 h ago: rates, roles and reward per version."""
    pg = open_page(finished["url"])
    p = pg.view("collection")  # the last 10 min hold no step: the chart shows the run's last window
    assert p.locator("#col-rates svg polyline.series").count() == 1
    assert "no steps yet" not in p.inner_text("#col-rates")
    assert "newest step" in p.inner_text("#col-rates-note")
    assert float(p.inner_text("#col-cards [data-key='steps/s (last window with data)'] .v")) > 0
    assert p.evaluate(CHART_PROBLEMS) == []

    p = pg.view("representation")
    p.wait_for_selector("#rep-table th:has-text('role / seat')")
    p.select_option("#rep-filter select[name=order]", "created")  # oldest first: GAME_SEATS' order
    p.wait_for_function("document.querySelector('#rep-table tbody tr').textContent.includes('villager · seat 1')")
    cells = p.eval_on_selector_all("#rep-table tbody tr", """rows => rows.map(r => {
        const i = [...r.closest('table').querySelectorAll('th')].findIndex(h => h.textContent === 'role / seat');
        return r.children[i].textContent; })""")
    assert cells == [f"{role} · seat {seat}" for _, role, seat, _, versions, _, _ in GAME_SEATS for _ in versions]
    pg.shot("roles", "#view-representation .panel >> nth=0")
    p.locator("#rep-table tbody tr >> nth=0").click()
    p.wait_for_selector("#rep-role")
    assert p.inner_text("#rep-role") == "villager · seat 1"

    p = pg.view("consumption")
    assert "Episode reward per policy version" in p.inner_text("#view-consumption")
    assert "whose steps were all generated by that policy version" in p.inner_text("#con-reward-note")
    assert "2 finished episodes spanning versions are left out" in p.inner_text("#con-reward-note")
    assert _ticks(p, "#con-reward", "xt") == ["0", "1"]
    legend = p.eval_on_selector_all("#con-reward svg .legend-item", "els => els.map(e => e.dataset.series)")
    assert legend == ["default (eval)", "default (train)", "wolf (train)"]
    assert p.evaluate(CHART_PROBLEMS) == []
    pg.shot("reward-per-version", "#con-reward >> xpath=..")
    assert pg.errors == []


def test_live_update_without_reload(dash, open_page) -> None:
    pg = open_page(dash["url"])
    p = pg.view("collection")
    before = _num(p.inner_text("#col-cards [data-key='steps'] .v"))
    p.evaluate("window.__marker = 1")  # survives only if the page is not reloaded
    run_groups(dash["url"], 3, groups=1, group_size=2, turns=1)
    p.wait_for_function(f"Number(document.querySelector(\"#col-cards [data-key='steps'] .v\").textContent"
                        f".replace(/,/g, '')) >= {before + 2}", timeout=20_000)
    assert p.evaluate("window.__marker") == 1
    assert pg.errors == []


def test_label_in_ui_excludes_steps_from_the_lease(dash, open_page, tmp_path) -> None:
    pool, url = dash["pool"], dash["url"]
    target, other = "echo-2-0", "echo-2-1"  # unconsumed groups of the last round
    bad = {s.step_id for s in pool.query_steps(StepFilter(group_id=target), limit=100)}
    assert bad
    # writes need the admin token
    r = httpx.post(url + "/dashboard/api/labels", json={"target": "step", "target_ids": sorted(bad), "label": "x"})
    assert r.status_code == 401

    pg = open_page(url)
    p = pg.view("curation")
    p.fill("#token", ADMIN)
    p.fill("#cur-filter input[name=group_id]", target)
    p.wait_for_function(f"document.querySelectorAll('#cur-table .sel-step').length === {len(bad)}")
    p.check("#cur-all")
    p.fill("#cur-label input[name=label]", "garbled")
    p.check("#cur-label input[name=exclude]")
    p.fill("#cur-label input[name=note]", "tool output cut off")
    p.click("#cur-label-btn")
    p.wait_for_function("document.querySelector('#cur-label-msg').textContent !== ''")
    assert "excluded" in p.inner_text("#cur-label-msg"), p.inner_text("#cur-label-msg")
    assert all(lbl.exclude for s in bad for lbl in pool.labels(s))
    p.wait_for_selector("#cur-labels td:has-text('garbled')")

    # the trainer's lease (over HTTP, with the trainer's filter) no longer returns them
    flt = StepFilter.trainable("default", group_ids=[target, other]).model_dump(mode="json")
    r = httpx.post(url + "/v1/pool/leases", json={"filter": flt, "max_groups": 5, "ttl_s": 30},
                   headers={"Authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    leased = {s["step_id"] for s in r.json()["steps"]}
    assert leased and not leased & bad
    assert r.json()["group_ids"] == [other]
    httpx.post(url + f"/v1/pool/leases/{r.json()['lease_id']}/release",
               headers={"Authorization": f"Bearer {ADMIN}"}).raise_for_status()

    # export the selection (the other group) to Parquet from the UI
    p.fill("#cur-filter input[name=group_id]", other)
    p.wait_for_function(f"document.querySelector('#cur-json').textContent.includes('{other}')")
    p.click("#cur-export")
    link = p.wait_for_selector("#cur-download")
    with p.expect_download() as dl:
        link.click()
    path = tmp_path / "sel.parquet"
    dl.value.save_as(path)
    df = pl.read_parquet(path)
    assert set(df["group_id"]) == {other} and df.height == pool.count_steps(StepFilter(group_id=other))
    assert df["response_ids"].list.len().min() > 0
    assert pg.errors == []
