"""The openenv adapter: options, the reward and prompt helpers, and episodes through the real gateway, with the
server the task starts (ended after) and with a server given by URL."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("openenv.core", reason="openenv-core is not installed (pip install 'swarmpool[envs]')")

from tiny_gateway import tiny_gateway  # noqa: E402

from experiments import openenv as oe_task  # noqa: E402
from experiments.openenv.episode import action_field, prompt_text  # noqa: E402
from experiments.openenv.server import running, stop_servers  # noqa: E402
from swarm.client.task import check_options, load_task  # noqa: E402
from swarm.client.worker import WorkerConfig, run_worker  # noqa: E402
from swarm.pool import Pool  # noqa: E402
from swarm.pool.filter import StepFilter  # noqa: E402
from swarm.stack import ServerThread  # noqa: E402


def test_options_are_checked() -> None:
    task = load_task("openenv")
    check_options(task, {})
    for options, message in [({"environment": "x"}, "task.options.environment: unknown key"),
                             ({"env": "experiments.echo"}, "task.options.env=experiments.echo: .*module:Class"),
                             ({"env": "experiments.echo:WORDS"}, "not a subclass of openenv's Environment"),
                             ({"env": "experiments.nothing:Env"}, "no module"), ({"reward": "mean"}, "task.options.reward="),
                             ({"max_turns": 0}, "task.options.max_turns="), ({"url": "ws://x"}, "http:// or https://"),
                             ({"url": "http://127.0.0.1:9"}, "no openenv server answers"),
                             ({"action_field": "code"}, "no field 'code'")]:
        with pytest.raises(ValueError, match=message):
            check_options(task, options)


def test_rewards_prompts_and_action_fields() -> None:
    assert oe_task.episode_reward([0.25, None, 0.5]) == {"reward": 0.75, "return": 0.75, "last": 0.5}
    assert oe_task.episode_reward([0.25, 1], "last")["reward"] == 1.0 and oe_task.episode_reward([])["reward"] == 0.0
    assert prompt_text({"prompt": "say x", "echoed_message": "y", "done": False}) == "say x"
    assert prompt_text({"echoed_message": "hi", "message_length": 2, "reward": 0.2}) == "hi"  # openenv's echo_env
    assert prompt_text({"board": [1, 2], "turn": 3}) == "board: [1, 2]\nturn: 3"
    assert prompt_text({"a": "x", "b": "y"}, "b") == "y"
    schema = {"properties": {"message": {"type": "string"}, "metadata": {"type": "object"}}, "required": ["message"]}
    assert action_field(schema) == "message" == action_field(schema, "message")
    with pytest.raises(ValueError, match="also requires"):
        action_field({"properties": {"code": {"type": "string"}, "n": {"type": "integer"}}, "required": ["code", "n"]})
    with pytest.raises(ValueError, match="set task.options.action_field"):
        action_field({"properties": {"a": {"type": "string"}, "b": {"type": "string"}}})


def test_open_sessions_per_worker_process() -> None:
    """64 on a task-started server, 1 when the environment is not concurrent-safe (openenv refuses more), and 1
    on a server given by URL (openenv's default capacity) unless max_sessions says otherwise."""
    Options = oe_task.Options
    assert (Options().sessions(True), Options().sessions(False)) == (64, 1)
    assert (Options(max_sessions=4).sessions(True), Options(max_sessions=4).sessions(False)) == (4, 1)
    assert Options(url="http://127.0.0.1:8000").sessions() == 1
    assert Options(url="http://127.0.0.1:8000", max_sessions=4).sessions() == 4


def test_the_example_environment_scores_each_round() -> None:
    from experiments.openenv.echo_rounds import ROUNDS, EchoRoundsAction, EchoRoundsEnv

    env = EchoRoundsEnv()
    first = env.reset(seed=7)
    assert env.reset(seed=7).prompt == first.prompt and not first.done  # the seed fixes the episode
    words, rewards, obs = env.state.words, [], first
    for k in range(ROUNDS):
        obs = env.step(EchoRoundsAction(message=words[k] if k == 0 else "zzz"))
        rewards.append(obs.reward)
    assert obs.done and rewards[0] == pytest.approx(1 / ROUNDS) and sum(rewards) < 0.5
    with pytest.raises(ValueError, match="reset it"):
        env.step(EchoRoundsAction(message="x"))


def _check_episodes(pool: Pool, count: int) -> None:
    episodes = pool.query_episodes(StepFilter(task="openenv"), limit=100)
    assert len(episodes) == count
    first_prompts: dict[str, set[str]] = {}
    for ep in episodes:
        metrics = ep.metadata["metrics"]
        assert ep.status.value == "finished" and metrics["turns"] == 3.0 and metrics["done"] == 1.0
        assert ep.reward == pytest.approx(metrics["return"]) and 0.0 <= ep.reward <= 1.0
        steps = pool.query_steps(StepFilter(episode_id=ep.episode_id), with_tokens=True, order="episode")
        assert len(steps) == 3 and all(s.response_ids for s in steps)
        assert [len(s.prompt_messages) for s in steps] == [1, 3, 5]  # history: each prompt extends the last turn
        assert steps[1].prompt_messages[-1]["content"].startswith("score ")
        first_prompts.setdefault(ep.group_id, set()).add(steps[0].prompt_messages[0]["content"])
    assert all(len(p) == 1 for p in first_prompts.values())  # a group is one seeded environment instance


def test_episodes_on_the_server_the_task_starts(tmp_path: Path, warm_tiny_model_path: Path,
                                                caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture) -> None:
    """Two groups of two on the tiny model: three recorded calls per episode; the task's server ends after, and
    logged no traceback for the sessions its clients closed."""
    stop_servers()
    with tiny_gateway(tmp_path, warm_tiny_model_path) as (url, pool):
        stats = run_worker(WorkerConfig(server=url, task="openenv", workers=2, group_size=2, max_groups=2, seed=5,
                                        max_tokens=8, options={"env": oe_task.DEFAULT_ENV}))
        assert stats["episodes"] == 4 and stats["failed"] == 0, caplog.text
        _check_episodes(pool, 4)
    assert len(running()) == 1
    assert stop_servers() == 1 and running() == []
    assert "Exception in ASGI application" not in capfd.readouterr().err


def test_episodes_on_a_server_given_by_url(tmp_path: Path, warm_tiny_model_path: Path) -> None:
    """A server the test runs (openenv's create_app) is stepped by URL; the task starts no server of its own."""
    from openenv.core.env_server import create_app

    from experiments.openenv.echo_rounds import EchoRoundsAction, EchoRoundsEnv, EchoRoundsObservation

    env_server = ServerThread(create_app(EchoRoundsEnv, EchoRoundsAction, EchoRoundsObservation,
                                         max_concurrent_envs=2)).start()
    try:
        with tiny_gateway(tmp_path, warm_tiny_model_path) as (url, pool):
            stats = run_worker(WorkerConfig(server=url, task="openenv", workers=2, group_size=2, max_groups=1, seed=9,
                                            max_tokens=8, options={"url": env_server.url, "max_sessions": 2}))
            assert stats["episodes"] == 2 and stats["failed"] == 0
            _check_episodes(pool, 2)
        assert running() == []
    finally:
        env_server.stop()
    assert not env_server.thread.is_alive()
