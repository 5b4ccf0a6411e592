"""The reasoning_gym adapter: options, seeded disjoint splits, the generator's score as reward, episodes via the gateway."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'swarmpool[envs]')")

from tiny_gateway import tiny_gateway  # noqa: E402

from experiments import reasoning_gym as rg_task  # noqa: E402
from experiments.reasoning_gym import Options, gym_reward, item, split_seed  # noqa: E402
from swarm.client.task import check_options, configure_task, load_task  # noqa: E402
from swarm.client.worker import WorkerConfig, run_worker  # noqa: E402
from swarm.pool.filter import StepFilter  # noqa: E402

SPELL = {"dataset": "spell_backward", "config": {"spell_backward": {"min_word_len": 3, "max_word_len": 5}}}


def test_bad_options_are_refused_with_the_key() -> None:
    task = load_task("reasoning_gym")
    check_options(task, SPELL)
    with pytest.raises(ValueError, match="no generator 'nope'"):
        check_options(task, {"dataset": "nope"})
    with pytest.raises(ValueError, match=r"task.options.datset: unknown key \(did you mean task.options.dataset\?\)"):
        check_options(task, {"datset": "basic_arithmetic"})
    with pytest.raises(ValueError, match="refuses config"):
        check_options(task, {"dataset": "basic_arithmetic",
                             "config": {"basic_arithmetic": {"min_terms": 5, "max_terms": 2}}})
    with pytest.raises(ValueError, match="task.options.config=.*seed or size"):
        check_options(task, {"dataset": "basic_arithmetic", "config": {"basic_arithmetic": {"seed": 1}}})
    with pytest.raises(ValueError, match="task.options.config.basic_arithmetic=5: "):
        check_options(task, {"config": {"basic_arithmetic": 5}})


def test_items_are_seeded_and_eval_seeds_never_meet_training_seeds() -> None:
    opts = Options(dataset="basic_arithmetic")
    assert item(opts, 7)[0] == item(opts, 7)[0]
    assert item(opts, 7, "train")[0]["question"] != item(opts, 7, "eval")[0]["question"]
    train = {split_seed(opts, s, "train") for s in (0, 1, 2**31 - 1, 2**40 + 5, 900_000_000)}
    held_out = {split_seed(opts, s, "eval") for s in (0, 1, 2**31 - 1, 2**40 + 5, 900_000_000)}
    assert max(train) < min(held_out) and max(held_out) < 2**32  # any worker seed: the splits cannot meet


def test_the_generator_scores_the_extracted_answer() -> None:
    entry, dataset = item(Options(dataset="spell_backward"), 3)
    word = entry["answer"]
    assert gym_reward(word, entry, dataset)["reward"] == 1.0
    tagged = gym_reward(f"thinking... <answer>{word}</answer>", entry, dataset)
    assert tagged["reward"] == 1.0 and tagged["tagged"] == 1.0 and tagged["exact"] == 1.0
    assert gym_reward(word, entry, dataset, answer_tags=True)["answered"] == 0.0  # tags required and missing
    partial = gym_reward(word[0] + "#" * (len(word) - 1), entry, dataset)  # spell_backward credits letters in place
    assert 0.0 < partial["reward"] < 1.0 and partial["exact"] == 0.0
    assert gym_reward(None, entry, dataset)["reward"] == 0.0


def test_episodes_through_the_gateway_train_and_held_out(tmp_path: Path, warm_tiny_model_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Two groups on the tiny model: the second is an eval group, drawn from the held-out seed range."""
    assert load_task("reasoning_gym").run_multiagent is not None  # the worker hands it the episode kind
    with tiny_gateway(tmp_path, warm_tiny_model_path) as (url, pool):
        stats = run_worker(WorkerConfig(server=url, task="reasoning_gym", workers=2, group_size=2, max_groups=2,
                                        seed=11, eval_every=2, max_tokens=8, options=SPELL))
        assert stats["episodes"] == 4 and stats["failed"] == 0, caplog.text  # the worker logs why an episode failed
        episodes = pool.query_episodes(StepFilter(task="reasoning_gym"), limit=100)
        assert len(episodes) == 4 and all(ep.status.value == "finished" for ep in episodes)
        by_split = {ep.metadata["split"]: ep for ep in episodes}
        assert by_split["eval"].type.value == "eval" and by_split["train"].type.value == "train"
        assert by_split["eval"].metadata["entry_seed"] >= 2**31 > by_split["train"].metadata["entry_seed"]
        for ep in episodes:
            assert 0.0 <= ep.reward <= 1.0 and ep.metadata["dataset"] == "spell_backward"
            assert ep.metadata["metrics"]["answered"] in (0.0, 1.0)
            steps = pool.query_steps(StepFilter(episode_id=ep.episode_id), with_tokens=True)
            assert len(steps) == 1 and steps[0].response_ids and steps[0].prompt_messages[-1]["role"] == "user"
            assert "backward" in steps[0].prompt_messages[-1]["content"]


def test_run_episode_plays_the_training_split(tmp_path: Path, warm_tiny_model_path: Path) -> None:
    """The plain run_episode path (cocktail, the research agent's dry runs) works on the configured generator."""
    configure_task(load_task("reasoning_gym"), SPELL)
    assert rg_task.make_instance(4)["split"] == "train"
    with tiny_gateway(tmp_path, warm_tiny_model_path) as (url, pool):
        from swarm.client.sdk import SwarmClient
        from swarm.client.task import AgentLLM

        with SwarmClient(url) as client, client.episode(task="reasoning_gym") as ep:
            parts = rg_task.run_episode(rg_task.make_instance(4), AgentLLM(ep.base_url, ep.api_key, max_tokens=8))
            ep.end(reward=parts["reward"])
        assert set(parts) >= {"reward", "score", "exact", "tagged", "answered"}


def test_seeded_held_out_replies_replay_under_the_same_weights(tmp_path: Path, warm_tiny_model_path: Path) -> None:
    """WorkerConfig.seeded (benchmarks/reasoning_gym_bench.py's eval): the same entries get the same replies at
    temperature 1, so a before/after pair shares its randomness and an unchanged policy gains exactly 0."""
    with tiny_gateway(tmp_path, warm_tiny_model_path) as (url, pool):
        replies = []
        for _ in range(2):
            run_worker(WorkerConfig(server=url, task="reasoning_gym", workers=3, group_size=1, max_groups=6, seed=5,
                                    eval_every=1, max_tokens=8, temperature=1.0, options=SPELL, seeded=True))
            steps = pool.query_steps(StepFilter(task="reasoning_gym"), limit=100)
            eps = {ep.episode_id: ep.metadata["entry_seed"] for ep in pool.query_episodes(StepFilter(), limit=100)}
            replies.append(sorted((eps[s.episode_id], s.response_text) for s in steps))
        first, both = replies[0], replies[1]
        assert len(first) == 6 and sorted(set(both)) == first and len(both) == 12  # each entry twice, the same reply
        assert len({r for _, r in first}) > 1  # sampled, not one fixed string
