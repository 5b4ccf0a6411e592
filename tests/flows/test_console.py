"""What the terminal and MLflow get from the pool while a run collects: progress activity and task metrics."""

from __future__ import annotations

import time
from pathlib import Path

from flows.console import TrainProgress, summary_values
from swarm import loop
from swarm.pool import Pool
from swarm.records import Episode, EpisodeType, Step


def _played(pool: Pool, n: int, kind: EpisodeType = EpisodeType.train, **metrics: float) -> None:
    for i in range(n):
        ep = pool.add_episode(Episode(task="werewolves", type=kind, group_id=f"g{i}"))
        pool.add_step(Step(episode_id=ep.episode_id, index=0, prompt_ids=[1, 2], response_ids=[3],
                           response_logprobs=[-0.5]))
        pool.end_episode(ep.episode_id, reward=metrics.get("win", 0.0), metadata={"metrics": metrics})


def test_progress_line_says_what_collection_is_doing(tmp_path: Path) -> None:
    """While the first batch collects, the line shows finished episodes and recorded calls per second."""
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    try:
        progress = TrainProgress(3, pool)
        first = progress._activity()
        assert first == " (0 episodes done, 0.0 calls/s)"
        _played(pool, 4)
        progress._seen = (progress._seen[0] - 2.0, progress._seen[1])  # as if the last count was 2 s ago
        second = progress._activity()
        assert second.startswith(" (4 episodes done, ") and second.endswith(" calls/s)") and "0.0 calls/s" not in second
    finally:
        pool.close()


def test_episode_metrics_are_what_the_task_reported(tmp_path: Path) -> None:
    """``episodes/<key>`` and ``eval/<key>``: means of each episode's reported numbers since the last update."""
    pool = Pool(f"sqlite:///{tmp_path / 'pool.db'}")
    try:
        t0 = time.time() - 1
        _played(pool, 2, win=1.0, rounds=3.0, win_seer=1.0)
        _played(pool, 2, win=0.0, rounds=5.0)
        _played(pool, 1, EpisodeType.eval, win=1.0)
        m = loop.episode_metrics(pool, t0)
        assert m["episodes/n"] == 4 and m["episodes/win"] == 0.5 and m["episodes/rounds"] == 4.0
        assert m["episodes/win_seer"] == 1.0  # only the episodes that reported it
        assert m["eval/n"] == 1 and m["eval/win"] == 1.0 and m["eval/reward"] == 1.0
        assert loop.episode_metrics(pool, time.time() + 1) == {}  # nothing ended since then
        _played(pool, 2, EpisodeType.eval, win=0.0)
        s = loop.eval_summary(pool, t0, games=2)
        assert s == {"summary/eval_win_first": 0.5, "summary/eval_win_last": 0.0, "summary/eval_games": 3.0}
        # a frozen opponent's seats are eval episodes too: they never count as the trained side's results
        ep = pool.add_episode(Episode(task="werewolves", type=EpisodeType.eval, metadata={"policy": "wolfbot"}))
        pool.end_episode(ep.episode_id, reward=1.0, metadata={"metrics": {"win": 1.0}})
        assert loop.episode_metrics(pool, t0, policies=["default"])["eval/n"] == 3
        assert loop.eval_summary(pool, t0, games=2, policies=["default"])["summary/eval_games"] == 3.0
    finally:
        pool.close()


def test_summary_values_are_sortable_numbers() -> None:
    rows = [{"reward/mean": r} for r in (0.1, 0.2, 0.3, 0.4, 0.5, 0.9)]
    s = summary_values(rows, wall_s=120.0)
    assert s["updates"] == 6 and s["wall_min"] == 2.0 and s["reward_best"] == 0.9
    assert abs(s["reward_first5"] - 0.3) < 1e-12 and abs(s["reward_last10"] - 0.4) < 1e-12
