"""Synthetic batches with the sharing shapes the merge exploits (for tests and benchmarks).

- :func:`random_tree_items`: random branching sequences (forks at random points, duplicates,
  prefixes of other items, empty prompts) to stress the trie and the layout.
- :func:`multiturn_items`: GRPO groups of multi-turn episodes: a shared system prompt, a group
  prompt, then turns whose prompt is the whole previous call plus a new observation.
- :func:`werewolves_items`: one game of N players, ~20 calls each, a shared system prompt, a
  private role card per player, a growing per-player history.

Token ids are random; behaviour logprobs and advantages are random but deterministic for a
seed. These are not recorded episodes and say nothing about model quality.
"""

from __future__ import annotations

import random

from swarm.merge.items import TrainSeq

__all__ = ["random_tree_items", "multiturn_items", "werewolves_items"]


def _toks(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def _item(rng: random.Random, name: str, prompt: list[int], response: list[int], episode: str = "") -> TrainSeq:
    return TrainSeq(step_id=name, prompt_ids=tuple(prompt), response_ids=tuple(response),
                    behaviour_logprobs=tuple(-rng.uniform(0.05, 4.0) for _ in response), advantage=rng.gauss(0.0, 1.0),
                    episode_id=episode)


def random_tree_items(seed: int, n_items: int = 12, vocab: int = 50, max_new: int = 12) -> list[TrainSeq]:
    """Random forks of earlier sequences; small vocabularies make accidental sharing common too."""
    rng = random.Random(seed)
    seqs: list[list[int]] = []
    items = []
    for i in range(n_items):
        r = rng.random()
        if seqs and r < 0.1:
            seq = list(rng.choice(seqs))  # exact duplicate
        elif seqs and r < 0.2:
            src = rng.choice(seqs)
            seq = src[: rng.randint(1, len(src))]  # a prefix of another item
        elif seqs and r < 0.8:
            src = rng.choice(seqs)
            seq = src[: rng.randint(0, len(src))] + _toks(rng, rng.randint(1, max_new), vocab)
        else:
            seq = _toks(rng, rng.randint(1, 2 * max_new), vocab)
        seqs.append(seq)
        cut = rng.randint(0, len(seq) - 1)  # prompt may be empty; response has >= 1 token
        items.append(_item(rng, f"rt{seed}-{i}", seq[:cut], seq[cut:]))
    return items


def multiturn_items(
    seed: int,
    groups: int = 2,
    group_size: int = 3,
    turns: int = 3,
    system_len: int = 12,
    prompt_len: int = 6,
    obs_len: int = 4,
    response_len: int = 5,
    vocab: int = 100,
) -> list[TrainSeq]:
    """GRPO groups of multi-turn chats: each turn's prompt is the previous call plus new tokens."""
    rng = random.Random(seed)
    system = _toks(rng, system_len, vocab)
    items = []
    for g in range(groups):
        task = system + _toks(rng, prompt_len, vocab)
        for e in range(group_size):
            history = list(task)
            for t in range(turns):
                prompt = history + (_toks(rng, obs_len, vocab) if t else [])
                response = _toks(rng, rng.randint(1, response_len), vocab)
                items.append(_item(rng, f"mt{seed}-g{g}-e{e}-t{t}", prompt, response, f"g{g}-e{e}"))
                history = prompt + response
    return items


def werewolves_items(
    seed: int,
    players: int = 9,
    calls: int = 20,
    system_len: int = 300,
    role_len: int = 30,
    obs_len: int = 16,
    response_len: int = 12,
    vocab: int = 1000,
) -> list[TrainSeq]:
    """One game shaped like 9-player Werewolves: shared system prompt, per-player growing history."""
    rng = random.Random(seed)
    system = _toks(rng, system_len, vocab)
    items = []
    for p in range(players):
        history = system + _toks(rng, role_len, vocab)
        for c in range(calls):
            prompt = history + _toks(rng, rng.randint(obs_len // 2, obs_len * 3 // 2), vocab)
            response = _toks(rng, rng.randint(response_len // 2, response_len * 3 // 2), vocab)
            items.append(_item(rng, f"ww{seed}-p{p}-c{c}", prompt, response, f"player{p}"))
            history = prompt + response
    return items
