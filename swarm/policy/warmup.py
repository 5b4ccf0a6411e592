"""A deterministic supervised warm-up for the tiny model, so RL has something to start from.

A randomly initialised model never learns to end its turn and RL stalls near zero reward
(ENVIRONMENT.md, "RL on a tiny model"). :func:`word_chain_warmup` trains it briefly on
synthetic chats of a word-chain game: the user says a few nouns, the assistant answers with
one noun that starts with the last letter of the user's last noun — or, in ``repeat_p`` of the
chats, with that last noun itself. The model learns the reply format (one word, then
``<|im_end|>``) and to read the user's last word. Because some replies repeat the word, the
warm-up leaks part of the echo task: the warmed model sometimes answers echo prompts correctly
(``pytest -s tests/policy/test_warmup.py -k echoes`` prints the rate on 96 samples and asserts it
stays under 30%), and RL gains are reported against that start.

It does not know any task package; NOUNS simply contains the echo task's words.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["NOUNS", "VERBS", "WARMUPS", "get_warmup", "warmup_chats", "word_chain_warmup", "chat_rows", "fit_replies",
           "reply_loss"]

NOUNS = (
    "apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "candle", "garden", "rocket",
    "silver", "window", "forest", "button", "planet", "castle", "eagle", "engine", "island", "orange",
    "nest", "table", "egg", "goat", "train", "night", "heart", "tree", "road", "door", "rain", "nose",
    "snake", "kite", "ear", "ring", "grape", "echo", "owl", "lamp", "pear", "robot", "tent", "yard",
    "dog", "game", "ocean", "note", "drum", "moon", "navy", "year", "sun", "leaf", "fox", "xray",
    "zebra", "arrow", "wolf", "field", "desk", "kettle", "hat", "mouse",
)
VERBS = ("say", "repeat", "echo", "tell", "give", "name")
# the tiny model's warm-ups by their config name (model.warmup), as module:function
WARMUPS = {"word_chain": "swarm.policy.warmup:word_chain_warmup", "reading": "swarm.policy.copy_warmup:reading_warmup"}


def get_warmup(name: str) -> Callable[[PreTrainedModel, PreTrainedTokenizerBase], object]:
    """The warm-up function called ``name`` in :data:`WARMUPS` (KeyError naming the known ones): a
    :data:`swarm.policy.tiny.Warmup`."""
    import importlib

    if name not in WARMUPS:
        raise KeyError(f"unknown warm-up {name!r}; known: {', '.join(WARMUPS)}")
    module, attr = WARMUPS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def _reply(last: str, rng: random.Random, repeat_p: float) -> str:
    if rng.random() < repeat_p:
        return last
    chain = [w for w in NOUNS if w[0] == last[-1] and w != last]
    return rng.choice(chain) if chain else rng.choice(NOUNS)


def warmup_chats(n: int, seed: int = 0, repeat_p: float = 0.15) -> list[tuple[str, str]]:
    """``n`` (user text, assistant reply) pairs of the word-chain game, deterministic in ``seed``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = [rng.choice(NOUNS) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.5:
            words = [rng.choice(VERBS), *words[-1:]]
        out.append((" ".join(words), _reply(words[-1], rng, repeat_p)))
    return out


def word_chain_warmup(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, steps: int = 300, batch_size: int = 32, lr: float = 3e-3,
                      seed: int = 0, repeat_p: float = 0.15) -> list[float]:
    """Train ``model`` in place on word-chain chats (loss on the reply and its end token only).

    Returns the loss curve. Deterministic for a given model, tokenizer and seed.
    """
    import torch

    torch.manual_seed(seed)
    pairs = warmup_chats(steps * batch_size, seed=seed, repeat_p=repeat_p)
    rows = chat_rows(tokenizer, [([{"role": "user", "content": user}], reply) for user, reply in pairs])
    return fit_replies(model, rows, batch_size, lr, tokenizer.pad_token_id, desc="word-chain warm-up")


def chat_rows(tokenizer: PreTrainedTokenizerBase, chats: list[tuple[list[dict[str, str]], str]]) -> list[tuple[list[int], list[int]]]:
    """``(prompt ids, reply ids + <|im_end|>)`` per ``(messages, reply)``: the chat template's generation prompt, then the reply."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = []
    for messages, reply in chats:
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        rows.append((tokenizer.encode(prompt, add_special_tokens=False),
                     tokenizer.encode(reply, add_special_tokens=False) + [eos]))
    return rows


def fit_replies(model: PreTrainedModel, rows: list[tuple[list[int], list[int]]], batch_size: int, lr: float, pad: int,
                warmup_steps: int = 0, desc: str = "warm-up") -> list[float]:
    """Train ``model`` in place on ``(prompt ids, reply ids)`` rows, in order, ``batch_size`` per AdamW step.

    The loss covers the reply tokens only. ``warmup_steps`` > 0 multiplies the learning rate by
    ``min(1, (s + 1) / warmup_steps) * max(0.1, 1 - s / steps)`` at step ``s`` (a ramp, under a
    linear decay from the first step that floors at a tenth); 0 keeps it constant. Returns the
    loss curve; a progress bar shows on a terminal.
    """
    import torch
    from tqdm.auto import tqdm

    steps = len(rows) // batch_size
    if steps < 1:
        raise ValueError(f"fit_replies: {len(rows)} rows make no batch of {batch_size}")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup_steps) * max(0.1, 1 - s / steps) if warmup_steps else 1.0)
    losses = []
    for s in tqdm(range(steps), desc=desc, disable=None, leave=False):
        ids, labels, mask = _pad_batch(rows[s * batch_size:(s + 1) * batch_size], pad)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return losses


def reply_loss(model: PreTrainedModel, rows: list[tuple[list[int], list[int]]], pad: int, batch_size: int = 64) -> float:
    """Mean cross-entropy per reply token of ``(prompt ids, reply ids)`` rows: a warm-up's held-out quality."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(rows), batch_size):
            ids, labels, mask = _pad_batch(rows[s:s + batch_size], pad)
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            target = labels[:, 1:]
            nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                                    ignore_index=-100, reduction="sum")
            total, count = total + float(nll), count + int((target != -100).sum())
    return total / count


def _pad_batch(batch: list[tuple[list[int], list[int]]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, labels, attention mask) of right-padded rows (positions stay 0..n-1); labels only on the replies."""
    import torch

    width = max(len(p) + len(r) for p, r in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (p, r) in enumerate(batch):
        ids[i, :len(p) + len(r)] = torch.tensor(p + r)
        labels[i, len(p):len(p) + len(r)] = torch.tensor(r)
        mask[i, :len(p) + len(r)] = 1
    return ids, labels, mask
