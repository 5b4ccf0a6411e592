"""A generic reading warm-up for the tiny model: copy the number a named label holds.

A pretrained LLM can already look a fact up in its prompt; RL then teaches it which fact pays.
The 1.2M tiny model cannot, and a team reward is too weak a signal to grow that skill from
nothing (benchmarks/werewolves_reading.py: RL on "the vote named a wolf" moved the share of
wolf votes 0.35 -> 0.38 in 160 steps, while supervised copying reached 0.49 in 40; after this
warm-up the same RL probe goes 0.399 -> 0.549 in 20 steps on the shipped v3 model (0.44 -> 0.72 on
an earlier v2 build), and the werewolves bench's village learns to read the seer's accusation:
experiments/werewolves/README.md, "Learning"). With nothing asked, the warmed model copies some
``label:N`` line anyway: shown its own number as ``you:5`` it put 26-42% of its vote on itself (two
v2 builds), so the werewolves observation writes that number after a space (``you 5``: 13% on the
shipped model; ``python benchmarks/werewolves_reading.py --steps 0`` prints these shares).
:func:`label_copy_warmup` gives it the generic skill, on synthetic chats like::

    system: lemon rain pen
    user:   3 city:7
            weather:1,4,6
            key:2
            key?
    assistant: {"target":2}

Every user line is ``label:numbers`` (sometimes with a number in front, never the place the
answer is copied from), the last line asks for one single-valued label, and the reply copies its number as compact
JSON, the way the gateway's constrained decoding writes ``{"target":N}``. Numbers follow ``:`` or
``,`` as in the werewolves compact observation, so the copied digit is the same token.

What it does not teach: which line matters in any task. The labels are everyday
nouns (:data:`LABELS`), never a task's words: none of them appears in a werewolves observation
(tested), so a vote whose prompt names no label still has to learn from its reward which line
to read. Deterministic for a given model, tokenizer and seed.
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["LABELS", "copy_chats", "label_copy_warmup", "reading_warmup", "copy_accuracy"]

# one token each at a line start in the tiny tokenizer (so the asked label and its line hold the same
# token); none is a werewolves word (tests/policy/test_copy_warmup.py)
LABELS = (
    "city", "file", "key", "lemon", "item", "name", "number", "path", "query", "tool", "message", "error",
    "left", "move", "rain", "red", "read", "search", "start", "step", "weather", "direction", "expression",
    "calculator", "lookup", "war", "ward", "row", "old", "pen",
)


def copy_chats(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """``n`` (system, user, reply) triples of the label-copy game, deterministic in ``seed``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        labels = rng.sample(LABELS, rng.randint(2, 5))
        asked = rng.choice(labels)
        answer = rng.randint(0, 9)
        lines = []
        for label in labels:
            if label == asked:
                values = [answer]
            else:
                values = rng.sample(range(10), rng.choice((1, 1, 2, 3, 5)))
            prefix = f"{rng.randint(0, 9)} " if rng.random() < 0.3 else ""
            lines.append(f"{prefix}{label}:{','.join(map(str, values))}")
        lines.append(f"{asked}?")  # at a line start, like the lines: the same tokens as the label
        system = " ".join(rng.choice(LABELS) for _ in range(rng.randint(0, 4)))
        out.append((system, "\n".join(lines), f'{{"target":{answer}}}'))
    return out


def label_copy_warmup(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, steps: int = 1200, batch_size: int = 32, lr: float = 3e-3,
                      seed: int = 0) -> list[float]:
    """Train ``model`` in place on label-copy chats (loss on the reply and its end token only); the loss curve.

    The loss sits on a plateau (~0.39, guessing a number of the prompt) until copying forms, then
    falls slowly. From the integer-exact initialisation (``swarm.policy.tiny.exact_normal_``), after the
    word-chain warm-up, held-out copy accuracy (:func:`copy_accuracy`, chance 0.27) was 0.51 after 800
    steps at lr 2e-3 (the v2 recipe), 0.54 after 1200 at 2e-3, 0.65 after 2000 at 2e-3 and 0.64 after
    1200 at 3e-3 (this default, v3). Under v2 the result hung on float rounding (the same code gave 0.65
    on one machine and 0.42 on another), which is why the built model now ships
    (``swarm/policy/shipped.py``) instead of being built on each machine.
    """
    import torch

    from swarm.policy.warmup import chat_rows, fit_replies

    torch.manual_seed(seed)
    rows = chat_rows(tokenizer, [(([{"role": "system", "content": system}] if system else [])
                                  + [{"role": "user", "content": user}], reply)
                                 for system, user, reply in copy_chats(steps * batch_size, seed=seed)])
    return fit_replies(model, rows, batch_size, lr, tokenizer.pad_token_id, warmup_steps=50, desc="label-copy warm-up")


def reading_warmup(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """The word-chain warm-up (reply format, ending the turn), then :func:`label_copy_warmup`."""
    from swarm.policy.warmup import word_chain_warmup

    word_chain_warmup(model, tokenizer)
    label_copy_warmup(model, tokenizer)


# the tiny model's cache key: bump the version whenever LABELS, copy_chats or the defaults above change
reading_warmup.cache_key = "swarm.policy.copy_warmup.reading_warmup:v3"  # type: ignore[attr-defined]


def copy_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, n: int = 300, seed: int = 999) -> tuple[float, float]:
    """(greedy accuracy, chance) on ``n`` held-out label-copy chats: how often the digit after ``{"target":``
    is the asked label's number, and how often a random number of the prompt would be."""
    import torch

    hits, chance, test = 0, 0.0, copy_chats(n, seed=seed)
    with torch.no_grad():
        for system, user, reply in test:
            chat = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
            prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            ids = tokenizer.encode(prompt, add_special_tokens=False) + tokenizer.encode('{"target":', add_special_tokens=False)
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            answer = reply.removeprefix('{"target":').removesuffix("}")
            hits += tokenizer.decode([int(logits.argmax())]) == answer
            numbers = re.findall(r"(?<=[:,])\d", user)
            chance += numbers.count(answer) / len(numbers)
    return hits / n, chance / n
