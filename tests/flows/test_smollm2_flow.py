"""``flows.train +task=arithmetic model=smollm2``: the real model through the whole flow, one update (slow)."""

from __future__ import annotations

import pytest

from flows.train import train_flow
from swarm.pool import Pool, StepFilter

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]


def test_one_update_of_the_real_model(flow_config) -> None:
    pytest.importorskip("gguf", reason="model=smollm2 needs the gguf package (make setup installs it)")
    from swarm.errors import ValidationError
    from swarm.policy.gguf import resolve_gguf

    try:
        resolve_gguf("smollm2")
    except ValidationError as e:
        pytest.skip(str(e))
    cfg = flow_config("+task=arithmetic", "model=smollm2", "train.updates=1", "task.group_size=4",
                      "batching.min_groups=1", "task.max_tokens=8")
    summary = train_flow(cfg)
    assert summary["status"] == "FINISHED" and summary["updates"] == 1
    pool = Pool(cfg["pool"]["url"])
    try:
        consumed = pool.query_steps(StepFilter(consumed=True), limit=100, with_tokens=True)
        assert len({s.episode_id for s in consumed}) >= 4
        assert all(s.prompt_ids[:3] == [1, 9690, 198] for s in consumed)  # <|im_start|>system\n: SmolLM2's own template
        assert pool.latest_version("default") == 1
    finally:
        pool.close()
