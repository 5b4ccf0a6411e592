"""The dashboard over a real training run: the flow (tiny model, GRPO, real Prefect + MLflow) fills
the pool; the dashboard, served by a gateway over that pool, shows its batches, merges, versions."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from populate import run_groups

from swarm.pool import Pool, StepFilter
from swarm.stack import start_stack

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, chromium: Any, prefect_harness: None) -> Iterator[dict[str, Any]]:
    """Three updates of the default echo task, then a gateway (same tiny model) over the run's pool."""
    from flows.components import make_backend
    from flows.config import validate
    from flows.train import train_flow

    d = tmp_path_factory.mktemp("flowrun")
    overrides = [f"train.out_dir={d / 'run'}", f"mlflow.tracking_uri=sqlite:///{d / 'mlruns.db'}",
                 "mlflow.sample_trajectories=0", "train.updates=3", "batching.min_groups=2"]
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = OmegaConf.to_container(compose(config_name="train", overrides=overrides), resolve=True)
    summary = train_flow(cfg)
    assert summary["status"] == "FINISHED"
    pool = Pool(cfg["pool"]["url"])
    run = validate(cfg)
    backend = make_backend(run.model, run.policies, run.algo.lora)
    stack = start_stack(pool, backend)
    try:
        run_groups(stack.url, 9, groups=1, group_size=2, turns=2)  # live traffic next to the run's data
        yield {"url": stack.url, "pool": pool, "summary": summary}
    finally:
        stack.stop()
        pool.close()
        if hasattr(backend, "close"):
            backend.close()


def test_views_show_the_training_run(trained, open_page) -> None:
    pool = trained["pool"]
    pg = open_page(trained["url"])

    p = pg.view("collection")
    total = pool.count_steps(StepFilter(include_excluded=True))
    p.wait_for_function(f"document.querySelector(\"#col-cards [data-key='steps'] .v\").textContent"
                        f".replace(/,/g, '') === '{total}'")
    pg.shot("collection")

    p = pg.view("consumption")
    assert int(p.inner_text("#con-cards [data-key='leases acked'] .v")) == 3
    consumed = pool.count_steps(StepFilter(consumed=True, include_excluded=True))
    assert int(re.sub(r"\D", "", p.inner_text("#con-cards [data-key='steps consumed'] .v"))) == consumed
    assert p.locator("#con-reward svg circle").count() >= 2
    assert p.locator("#con-consumed svg rect").count() >= 3
    pg.shot("consumption")

    p = pg.view("merging")
    assert p.locator("#mrg-batches tbody tr").count() == 3
    saving = float(p.inner_text("#mrg-batches tbody tr >> nth=0 >> td >> nth=8").rstrip(" %"))
    assert saving > 0  # a group of 8 shares its prompt
    assert p.locator("#mrg-icicle svg rect").count() >= 2
    pg.shot("merging")

    p = pg.view("representation")
    step = pool.query_steps(StepFilter(consumed=True), limit=1, with_tokens=True)[0]
    p.fill("#rep-filter input[name=episode_id]", step.episode_id)
    p.locator(f"#rep-table td[title='{step.step_id}']").click()
    p.wait_for_selector(f"#rep-step dd:has-text('{step.step_id}')")
    lps = [float(x) for x in p.eval_on_selector_all("#rep-tokens .tok.r", "els => els.map(e => e.dataset.lp)")]
    assert lps == pytest.approx(step.response_logprobs)
    assert any(lp < -1e-3 for lp in lps)  # a real model's logprobs: not all certain
    # a second turn of a live multi-turn episode: it extends the first turn's exact tokens
    turn2 = next(s for s in pool.query_steps(StepFilter(task="echo-demo"), limit=20) if s.index == 1)
    p.fill("#rep-filter input[name=episode_id]", turn2.episode_id)
    p.locator(f"#rep-table td[title='{turn2.step_id}']").click()
    p.wait_for_selector(f"#rep-step dd:has-text('{turn2.step_id}')")
    assert "yes" in p.inner_text("#rep-prefix")
    pg.shot("representation")

    p = pg.view("curation")
    p.click("#cur-trainer")
    p.wait_for_function("document.querySelector('#cur-filter [name=reward_status]').value === 'final'")
    p.wait_for_function("document.querySelector('#cur-json').textContent.includes('final')")
    if p.locator("#cur-table .sel-step").count():
        p.check("#cur-table tbody tr >> nth=0 >> .sel-step")
    p.fill("#cur-label input[name=label]", "review")
    p.fill("#cur-label input[name=note]", "odd reply")
    pg.shot("curation")
    assert pg.errors == []
