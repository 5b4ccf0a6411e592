"""The math tool loop through a real gateway (EchoBackend) and the real worker: tool calls recorded, no crash."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.app import GatewaySettings, create_app
from swarm.client.worker import WorkerConfig, run_worker
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool
from swarm.pool.filter import StepFilter
from swarm.stack import ServerThread


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Pool]]:
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    server = ServerThread(create_app(pool, EchoBackend(), GatewaySettings())).start()
    yield server.url, pool
    server.stop()


def test_math_episodes_call_the_tool_and_get_scored(served: tuple[str, Pool]) -> None:
    url, pool = served
    stats = run_worker(WorkerConfig(server=url, task="math", workers=1, group_size=2, max_groups=1, seed=3,
                                    max_tokens=256))
    assert stats == {"episodes": 2, "failed": 0, "reward_sum": 0.0}
    episodes = pool.query_episodes(StepFilter(task="math"))
    assert len(episodes) == 2 and all(ep.status.value == "finished" and ep.reward == 0.0 for ep in episodes)
    # the echo model calls the calculator with {"input": ...}: a malformed call answered by an error result
    assert episodes[0].metadata["metrics"]["tool_errors"] == 1.0
    steps = pool.query_steps(StepFilter(episode_id=episodes[0].episode_id), with_tokens=True, order="episode")
    assert len(steps) == 2 and steps[0].tool_calls[0]["function"]["name"] == "calculator"
    assert steps[1].prompt_messages[-1]["role"] == "tool"
    assert steps[1].prompt_messages[-1]["content"].startswith("error:")
