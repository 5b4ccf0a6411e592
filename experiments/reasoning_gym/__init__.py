"""reasoning_gym: any reasoning-gym generator as a swarm task, its own verifier as the reward.

``python -m flows.train +task=reasoning_gym task.options.dataset=<generator>`` trains on one of the
library's ~100 procedural generators (arithmetic, puzzles, logic, games). An episode is one chat
call: the generator's question (after an optional system prompt) goes to the policy through the
episode's OpenAI endpoint; the reply is scored by the generator's ``score_answer``
(:mod:`experiments.reasoning_gym.reward`).

Held-out eval: the worker hands ``kind`` to ``run_multiagent`` (used here for one seat only, because
it is the hook that receives the episode kind), so eval groups draw from a seed range that training
never reaches (:mod:`experiments.reasoning_gym.gym`). ``run_episode`` (cocktail mixing, the research
agent's dry runs) always plays the training split. The options are :class:`Options`; the library is
imported on first use, and without it the run is refused at start-up with the pip command (``Options.check``).
"""

from __future__ import annotations

from typing import Any

from experiments.reasoning_gym.gym import PIP_HINT, SPLITS, Options, generator_names, item, library, split_seed
from experiments.reasoning_gym.reward import extract_answer, gym_reward
from swarm.client import AgentLLM
from swarm.client.worker import episode_llm

__all__ = ["Options", "PIP_HINT", "SPLITS", "make_instance", "run_episode", "run_multiagent", "play", "gym_reward",
           "extract_answer", "generator_names", "item", "library", "split_seed"]

TASK = "reasoning_gym"


def make_instance(seed: int) -> dict[str, Any]:
    """``{"seed", "dataset", "split", "question", "answer"}``: the training-split entry of this seed."""
    opts = Options.current()
    entry, _ = item(opts, seed, "train")
    return {"seed": int(seed), "dataset": opts.dataset, "split": "train", "question": entry["question"],
            "answer": str(entry["answer"])}


def play(entry: dict[str, Any], dataset: Any, llm: AgentLLM, options: Options) -> dict[str, float]:
    """Ask the entry's question in one chat call and score the reply; returns the reward parts."""
    system = options.prompt_text()
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": entry["question"]}]
    reply = llm.chat(messages)
    return gym_reward(reply.content, entry, dataset, options.answer_tags)


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """One episode on the instance's split (training unless the instance says otherwise)."""
    opts = Options.current()
    entry, dataset = item(opts, int(instance["seed"]), str(instance.get("split", "train")))
    return play(entry, dataset, llm, opts)


def run_multiagent(instance: dict[str, Any], client: Any, group_id: str, cfg: Any, kind: str = "train"
                   ) -> dict[str, float]:
    """One episode (one seat) whose entry comes from the eval split when ``kind`` is "eval"."""
    opts = Options.current()
    split = "eval" if kind == "eval" else "train"
    seed = int(instance["seed"])
    entry, dataset = item(opts, seed, split)
    metadata = {"seed": seed, "split": split, "dataset": opts.dataset, "entry_seed": split_seed(opts, seed, split)}
    with client.episode(task=TASK, group_id=group_id, type=kind, client_id=cfg.client_id,
                        timeout_s=cfg.episode_timeout_s, metadata=metadata) as ep:
        # seeded (WorkerConfig.seeded, the bench's eval): the same weights give the same reply to an entry
        llm = episode_llm(ep, cfg, f"{split}/{seed}")
        parts = play(entry, dataset, llm, opts)
        ep.end(reward=parts["reward"], **{k: v for k, v in parts.items() if k != "reward"})
    return parts
