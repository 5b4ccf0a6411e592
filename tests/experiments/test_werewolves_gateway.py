"""One werewolves game through a real gateway (EchoBackend) and the real worker: episodes and exact tokens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from swarm.client.worker import WorkerConfig, run_worker
from swarm.gateway import GatewaySettings, create_app
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool
from swarm.pool.filter import StepFilter
from swarm.stack import ServerThread


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Pool]]:
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    server = ServerThread(create_app(pool, EchoBackend(("default", "wolf", "frozen")), GatewaySettings())).start()
    yield server.url, pool
    server.stop()


def test_game_records_one_episode_per_llm_seat(served: tuple[str, Pool]) -> None:
    url, pool = served
    cfg = WorkerConfig(server=url, task="werewolves", workers=1, group_size=1, max_groups=1, seed=5, max_tokens=24,
                       options={"trainable_side": "wolves", "role_policies": {"werewolf": "wolf"},
                                "opponents": "policy:frozen", "observation": "transcript",
                                "constrained": False})  # the echo backend refuses JSON schemas (400)
    stats = run_worker(cfg)
    assert stats["episodes"] == 1 and stats["failed"] == 0
    episodes = pool.query_episodes(StepFilter(group_id="werewolves-5"))
    assert len(episodes) == 9 and all(ep.status.value == "finished" for ep in episodes)
    by_type = {t: [ep for ep in episodes if ep.type.value == t] for t in ("train", "eval")}
    assert len(by_type["train"]) == 3 and len(by_type["eval"]) == 6
    for ep in by_type["train"]:
        assert ep.metadata["role"] == "werewolf" and ep.reward is not None
        steps = pool.query_steps(StepFilter(episode_id=ep.episode_id), with_tokens=True, order="episode")
        assert steps and {s.policy for s in steps} == {"wolf"}
        for prev, nxt in zip(steps, steps[1:], strict=False):  # the conversation grows token-exactly
            assert nxt.prompt_ids[: len(prev.prompt_ids) + len(prev.response_ids)] == prev.prompt_ids + prev.response_ids
    assert {s.policy for ep in by_type["eval"] for s in pool.query_steps(StepFilter(episode_id=ep.episode_id))} == {"frozen"}
