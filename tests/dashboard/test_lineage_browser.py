"""The Lineage view in a real headless Chromium: from a version in Consumption to its steps, from a step to its lease and version, from Representation's step to its chain, feedback on the chain, no console errors."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from swarm.pool.schema import steps as S

pytestmark = pytest.mark.browser


def _consumed_by(pool, version: int) -> set[str]:
    with pool.engine.connect() as c:
        return set(c.execute(sa.select(S.c.step_id).where(S.c.consumed_version == version)).scalars())


def test_lineage_view_both_ways(dash, open_page) -> None:
    pool, leases = dash["pool"], dash["ids"]["leases"]
    pg = open_page(dash["url"])
    p = pg.view("consumption")
    rows = p.locator("#con-versions tr.click")
    rows.filter(has=p.locator("td:nth-child(2)", has_text="1")).filter(has_text="default").first.click()  # v1
    p.wait_for_function("location.hash === '#lineage'")
    p.wait_for_selector("#lin-version:not([hidden]) .lin-steps")
    assert "default v1" in p.inner_text("#lin-version")
    want = _consumed_by(pool, 1)
    titles = p.eval_on_selector_all("#lin-version .lin-steps a[title]", "els => els.map(e => e.title)")
    assert set(titles) == want  # fewer than a page: exactly the steps trained into v1
    assert p.inner_text("#lin-version [data-key='steps trained'] .v").replace(",", "") == str(len(want))
    p.locator("#lin-version .lin-steps a").first.click()  # a step -> its chain
    p.wait_for_selector("#lin-chain:not([hidden]) [data-node='lease']")
    assert leases[0] in p.inner_text("#lin-chain [data-node='lease']")
    assert "default v1" in p.inner_text("#lin-chain [data-node='update']")
    pg.shot("lineage", "#view-lineage")

    p = pg.view("representation")  # a step's detail links to its chain
    p.locator("#rep-table tr.click").first.click()
    p.locator("#rep-lineage").click()
    p.wait_for_function("location.hash === '#lineage'")
    step_id = p.evaluate("lin.step")
    p.wait_for_function(f"document.querySelector('#lin-chain [data-node=step]')?.innerText.includes({step_id!r})")

    p.fill("#lin-step-form input[name=step_id]", dash["ids"]["whitebox_step"])
    p.click("#lin-step-form button")
    p.wait_for_function("document.querySelector('#lin-chain [data-node=episode]')?.innerText.includes('fine')")
    assert "not leased" in p.inner_text("#lin-chain [data-node='lease']")
    assert not pg.errors, pg.errors
