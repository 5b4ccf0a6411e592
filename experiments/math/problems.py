"""Generated arithmetic word problems for the ``math`` task, deterministic in the seed.

Each problem is one of a few templates (add, subtract, multiply, share equally, two steps)
with small whole numbers, so the answer is always a whole number from 0 to a few hundred.
Nothing is downloaded or shipped. This module does not talk to any model or grade answers
(see :mod:`experiments.math.reward`).
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

__all__ = ["EVAL_SEED_BASE", "NAMES", "ITEMS", "make_problem", "make_calc_problem", "held_out"]

EVAL_SEED_BASE = 900_000_000  # held-out problems are drawn from seeds from here (training seeds are far below)

NAMES = ("Tom", "Sara", "Ali", "Mia", "Ken", "Lena", "Omar", "Zoe")
ITEMS = ("apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards")


def _add(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    return f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?", a + b


def _sub(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    a = rng.randint(10, 60)
    b = rng.randint(1, a - 1)
    return f"{name} had {a} {item} and gave {b} to a friend. How many {item} are left?", a - b


def _mul(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    return f"A box holds {a} {item}. {name} buys {b} boxes. How many {item} does {name} have?", a * b


def _div(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    per, kids = rng.randint(2, 12), rng.randint(2, 9)
    return (f"{name} shares {per * kids} {item} equally among {kids} children. "
            f"How many {item} does each child get?", per)


def _two_step(rng: random.Random, name: str, item: str) -> tuple[str, int]:
    a, b = rng.randint(5, 30), rng.randint(2, 20)
    c = rng.randint(1, a + b - 1)
    return (f"{name} has {a} {item}, finds {b} more, then loses {c}. "
            f"How many {item} does {name} have now?", a + b - c)


_TEMPLATES = {"add": _add, "sub": _sub, "mul": _mul, "div": _div, "two_step": _two_step}


def make_problem(seed: int) -> dict[str, Any]:
    """``{"seed", "kind", "question", "answer"}``: one word problem; the same seed gives the same problem."""
    rng = random.Random(seed)
    kind = rng.choice(sorted(_TEMPLATES))
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    question, answer = _TEMPLATES[kind](rng, name, item)
    return {"seed": seed, "kind": kind, "question": question, "answer": answer}


def held_out(question: str) -> bool:
    """Whether a problem belongs to the held-out quarter (a hash of its text): never trained on, only evaluated
    (the ``math`` calc problems and the ``arithmetic`` task alike)."""
    return hashlib.sha256(question.encode()).digest()[0] < 64


def make_calc_problem(seed: int, split: str = "train") -> dict[str, Any]:
    """``"What is 47 * 38 + 15?"``: too hard to do in one's head for a small model, one calculator call away.

    Deterministic in the seed; ``split`` ``train`` skips the held-out quarter, ``eval`` draws only from it."""
    rng = random.Random(seed)
    while True:
        a, b, c = rng.randint(12, 99), rng.randint(12, 99), rng.randint(2, 99)
        question = f"What is {a} * {b} + {c}?"
        if held_out(question) == (split == "eval"):
            return {"seed": seed, "kind": "calc", "question": question, "answer": a * b + c}
