"""The dashboard in a real headless Chromium over a real gateway run: every view renders the
pool's data, updates live, a label made in the UI changes what a lease returns, no console errors."""

from __future__ import annotations

import re

import httpx
import polars as pl
import pytest
from populate import ADMIN, run_groups

from swarm.pool import StepFilter

pytestmark = pytest.mark.browser


def _num(text: str) -> int:
    return int(re.sub(r"[^\d]", "", text))


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
