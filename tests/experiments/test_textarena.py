"""The textarena adapter: options, legal moves, the TicTacToe heuristic, rewards, and games through the gateway."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("textarena", reason="textarena is not installed (pip install 'swarmpool[envs]')")

from tiny_gateway import tiny_gateway  # noqa: E402

from experiments.textarena import (  # noqa: E402
    RandomPlayer,
    TicTacToeHeuristic,
    action_of,
    legal_moves,
    move_schema,
    play,
    seat_reward,
)
from swarm.client.task import check_options as check_task_options  # noqa: E402
from swarm.client.task import load_task  # noqa: E402
from swarm.client.worker import WorkerConfig, run_worker  # noqa: E402


def check_options(options: dict[str, object]) -> None:
    check_task_options(load_task("textarena"), options)
from swarm.pool.filter import StepFilter  # noqa: E402


def test_bad_options_are_refused_with_the_fix() -> None:
    check_options({})
    with pytest.raises(ValueError, match="task.options.opponent=heuristic: the heuristic opponent plays TicTacToe only"):
        check_options({"env_id": "ConnectFour-v0", "opponent": "heuristic"})
    with pytest.raises(ValueError, match="no environment 'TicTacToe-v9'"):
        check_options({"env_id": "TicTacToe-v9", "opponent": "random"})
    with pytest.raises(ValueError, match="task.options.opponent=wolfbot"):
        check_options({"opponent": "wolfbot"})
    with pytest.raises(ValueError, match=r"task.options.env: unknown key \(did you mean task.options.env_id\?\)"):
        check_options({"env": "TicTacToe-v0"})
    with pytest.raises(ValueError, match="does not list its legal moves"):
        check_options({"env_id": "ConnectFour-v0-train", "opponent": "random"})
    with pytest.raises(ValueError, match="Chess-v0 does not load here: SyntaxError"):  # needs Python 3.12
        check_options({"env_id": "Chess-v0", "opponent": "policy:frozen"})


def test_legal_moves_schema_and_action() -> None:
    obs = "Current Board: ...\n\nAvailable Moves: '[0]', '[4]', '[8]'"
    assert legal_moves(obs) == ["0", "4", "8"] and legal_moves("no list here") == []
    schema = move_schema(["0", "4", "8"])["json_schema"]["schema"]
    assert schema["properties"]["move"] == {"type": "integer", "enum": [0, 4, 8]}
    assert move_schema(["rock", "paper"])["json_schema"]["schema"]["properties"]["move"]["type"] == "string"
    assert action_of('{"move":4}', True) == "[4]" and action_of('{"move":"rock"}', True) == "[rock]"
    assert action_of("I pick [4]", False) == "I pick [4]"


def test_the_heuristic_wins_then_blocks() -> None:
    h = TicTacToeHeuristic(player=1, seed=0)  # plays X
    rng = random.Random(0)
    assert h.choose(["X", "X", "", "O", "O", "", "", "", ""], rng) == 2  # its own line first
    assert h.choose(["O", "O", "", "X", "", "", "", "", ""], rng) == 2   # else block
    assert h.choose([""] * 9, rng) == 4


def test_seat_rewards() -> None:
    assert seat_reward(1)["reward"] == 1.0 and seat_reward(1)["win"] == 1.0
    assert seat_reward(0)["reward"] == 0.5 and seat_reward(-1, invalid_move=True)["invalid_move"] == 1.0
    assert seat_reward(None, timeout=True) == {"reward": 0.5, "win": 0.0, "draw": 1.0, "loss": 0.0,
                                               "invalid_move": 0.0, "timeout": 1.0}


def test_the_heuristic_never_loses_to_random_play() -> None:
    """TextArena's own game loop with two rule-based players: the win-or-block heuristic beats random play."""
    import textarena

    results = []
    for seed in range(20):
        env = textarena.make(env_id="TicTacToe-v0-train")
        rewards, _, turns = play(env, {0: RandomPlayer(seed), 1: TicTacToeHeuristic(1, seed)}, seed, 200)
        assert rewards is not None and 5 <= turns <= 9
        results.append(rewards[1])
    assert min(results) >= 0 and sum(r > 0 for r in results) >= 10


@pytest.mark.parametrize("env_id", ["Othello-v0-train", "KuhnPoker-v0-train"])
def test_random_play_finishes_other_games_that_list_their_moves(env_id: str) -> None:
    import textarena

    check_options({"env_id": env_id, "opponent": "random"})
    rewards, info, turns = play(textarena.make(env_id=env_id), {0: RandomPlayer(1), 1: RandomPlayer(2)}, 1, 400)
    assert rewards is not None and turns > 2 and not any(i.get("invalid_move") for i in info.values())


def test_games_through_the_gateway(tmp_path: Path, warm_tiny_model_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The tiny model plays TicTacToe: against the heuristic (a train and an eval group), then against a frozen
    policy whose seat is an eval episode (never trained); every LLM move is one legal cell."""
    with tiny_gateway(tmp_path, warm_tiny_model_path, policies=("default", "frozen")) as (url, pool):
        stats = run_worker(WorkerConfig(server=url, task="textarena", workers=2, group_size=2, max_groups=2, seed=3,
                                        eval_every=2, max_tokens=16, options={}))
        assert stats["episodes"] == 4 and stats["failed"] == 0, caplog.text  # the worker logs why a game failed
        episodes = pool.query_episodes(StepFilter(task="textarena"), limit=100)
        assert sorted(ep.type.value for ep in episodes) == ["eval", "eval", "train", "train"]
        for ep in episodes:
            metrics = ep.metadata["metrics"]
            assert ep.status.value == "finished" and metrics["win"] + metrics["draw"] + metrics["loss"] == 1.0
            assert metrics["unreadable"] == 0.0 and metrics["invalid_move"] == 0.0  # constrained: always legal
            steps = pool.query_steps(StepFilter(episode_id=ep.episode_id), with_tokens=True, order="episode")
            assert len(steps) == metrics["calls"] >= 2 and all(s.response_ids for s in steps)  # a game lasts >= 5 moves
            assert "Available Moves" in steps[0].prompt_messages[-1]["content"]

        stats = run_worker(WorkerConfig(server=url, task="textarena", workers=1, group_size=1, max_groups=1, seed=8,
                                        max_tokens=16, options={"opponent": "policy:frozen"}))
        assert stats["failed"] == 0
        game = pool.query_episodes(StepFilter(group_id="textarena-8"), limit=10)
        assert len(game) == 2 and len({ep.metadata["game"] for ep in game}) == 1
        frozen = [ep for ep in game if ep.metadata["policy"] == "frozen"]
        assert len(frozen) == 1 and frozen[0].type.value == "eval"
        assert {s.policy for s in pool.query_steps(StepFilter(episode_id=frozen[0].episode_id))} == {"frozen"}
        rewards = sorted(ep.reward for ep in game)
        assert rewards in ([0.0, 1.0], [0.5, 0.5])  # one game, two seats: one wins, or both draw
