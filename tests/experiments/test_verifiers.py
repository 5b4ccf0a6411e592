"""The verifiers adapter: the example environment's rollouts run through the real gateway, the rubric is the reward."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import verifiers as vf_task

pytest.importorskip("verifiers.v1", reason="verifiers 0.4.0 is not installed: it pins openai<3, which this venv's "
                                           "openai 3.x and the agents extra refuse (docs/environments.md)")

from tiny_gateway import tiny_gateway  # noqa: E402

from swarm.client.worker import WorkerConfig, run_worker  # noqa: E402
from swarm.pool.filter import StepFilter  # noqa: E402


def test_options_are_checked() -> None:
    vf_task.check_options({})
    with pytest.raises(ValueError, match="unknown option"):
        vf_task.check_options({"environment": "x"})
    with pytest.raises(ValueError, match="does not load"):
        vf_task.check_options({"env": "experiments.echo"})  # a module without a Taskset


def test_rollouts_through_the_gateway_score_with_the_rubric(tmp_path: Path, warm_tiny_model_path: Path) -> None:
    """Two rows x two episodes on the tiny model: each episode is one recorded call, rewarded by the rubric."""
    with tiny_gateway(tmp_path, warm_tiny_model_path) as (url, pool):
        stats = run_worker(WorkerConfig(server=url, task="verifiers", workers=2, group_size=2, max_groups=2, seed=5,
                                        max_tokens=8, options={"env": vf_task.DEFAULT_ENV}))
        assert stats["episodes"] == 4 and stats["failed"] == 0
        episodes = pool.query_episodes(StepFilter(task="verifiers"), limit=100)
        assert len(episodes) == 4 and {ep.group_id for ep in episodes} == {"verifiers-5", "verifiers-6"}
        for ep in episodes:
            metrics = ep.metadata["metrics"]
            assert metrics["ok"] == 1.0
            assert ep.reward == pytest.approx(0.5 * metrics["rubric_exact"] + 0.5 * metrics["rubric_similarity"])
            steps = pool.query_steps(StepFilter(episode_id=ep.episode_id), with_tokens=True)
            assert len(steps) == 1 and steps[0].response_ids
            expected = {"verifiers-5": "echo piano", "verifiers-6": "say lemon"}[ep.group_id]  # rows 5 and 6
            assert steps[0].prompt_messages[-1]["content"] == expected
