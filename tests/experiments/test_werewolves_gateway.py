"""One werewolves game through a real gateway (EchoBackend) and the real worker: episodes and exact tokens."""

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


def test_an_eval_game_replays_exactly_whatever_else_is_served(tmp_path: Path) -> None:
    """A held-out game alone (group size 1, kind eval) samples with per-call seeds: played alone and played
    while another game shares the backend's batches, seed 7's seats make the same calls, token for token."""
    from swarm.policy.hf import HFBackend, HFSettings

    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    backend = HFBackend(HFSettings(backend="hf", warmup="reading").weights(), torch_threads=1)
    server = ServerThread(create_app(pool, backend, GatewaySettings())).start()
    try:
        seen: set[str] = set()
        runs = []
        for workers, groups in ((1, 1), (2, 2)):  # seed 7 alone, then seeds 7 and 8 side by side
            cfg = WorkerConfig(server=server.url, task="werewolves", workers=workers, group_size=1, eval_every=1,
                               max_groups=groups, seed=7, max_tokens=16)
            assert run_worker(cfg)["failed"] == 0
            new = [ep for ep in pool.query_episodes(StepFilter(group_id="werewolves-7")) if ep.metadata["game"] not in seen]
            seen |= {ep.metadata["game"] for ep in new}
            runs.append({ep.metadata["player"]: [(s.prompt_ids, s.response_ids) for s in pool.query_steps(
                StepFilter(episode_id=ep.episode_id), with_tokens=True, order="episode")] for ep in new})
        alone, shared = runs
        assert alone and sum(len(calls) for calls in alone.values()) >= 5
        assert alone == shared
    finally:
        server.stop()
        backend.close()
        pool.close()
