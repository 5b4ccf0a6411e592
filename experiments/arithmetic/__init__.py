"""arithmetic: small sums and differences ("What is 14 - 9?"), one turn, an exact checker.

The real-model learning task (``model=smollm2``): SmolLM2-135M-Instruct answers 34% of the held-out
problems right when greedy and 14% when sampled at temperature 1, often burying the number in
chatter that runs past ``max_tokens`` (``benchmarks/arithmetic_bench.py``), so GRPO has a middling
start and room to improve within a CPU budget. Chosen over the ``math`` word problems, where this
model's replies are rarely right with or without the calculator tool.

Problems are ``a op b`` with operands in ``1..max_operand`` and ``op`` in ``ops``; held-out
problems are a fixed quarter of them (by a hash of the problem text), so training never sees an
eval problem: seeds below :data:`EVAL_SEED_BASE` draw training problems, seeds from it draw eval
problems. Reward = 1 when the reply's final number (``\\boxed{}``, then "answer ... N", then the
last number) is the answer, else 0.
"""

from __future__ import annotations

import random
from functools import lru_cache
from typing import Any

from pydantic import Field

from experiments.math.problems import EVAL_SEED_BASE
from experiments.math.problems import held_out as _held_out  # a fixed quarter of the problems, by hash
from experiments.math.reward import parse_final_number
from swarm.client import AgentLLM, TaskOptions

__all__ = ["EVAL_SEED_BASE", "Options", "problems", "make_instance", "run_episode", "score"]

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class Options(TaskOptions):
    """``task.options``: operands 1..``max_operand``, operators from ``ops`` (any of ``+-*``)."""

    max_operand: int = Field(default=9, ge=1)
    ops: str = Field(default="+-", pattern=r"^[+*-]+$")


@lru_cache(maxsize=16)
def problems(max_operand: int = 9, ops: str = "+-", held_out: bool = False) -> tuple[tuple[str, int], ...]:
    """Every ``(question, answer)`` of one split, in a fixed order (differences never go below 0)."""
    bad = set(ops) - set(_OPS)
    if bad or not ops or max_operand < 1:
        raise ValueError(f"arithmetic: ops must be a non-empty string of {''.join(_OPS)} and max_operand >= 1")
    out = []
    for op in ops:
        for a in range(1, max_operand + 1):
            for b in range(1, max_operand + 1):
                if op == "-" and b > a:
                    continue
                q = f"What is {a} {op} {b}?"
                if _held_out(q) == held_out:
                    out.append((q, _OPS[op](a, b)))
    return tuple(out)


def make_instance(seed: int) -> dict[str, Any]:
    """A deterministic problem: from the held-out split when ``seed >= EVAL_SEED_BASE``, else training."""
    opts = Options.current()
    split = problems(opts.max_operand, opts.ops, held_out=seed >= EVAL_SEED_BASE)
    question, answer = split[random.Random(seed).randrange(len(split))]
    return {"question": question, "answer": answer}


def score(reply: str | None, answer: int) -> dict[str, float]:
    """``{"reward", "correct", "answered"}``: 1 when the reply's final number is the answer."""
    value = parse_final_number(reply)
    correct = float(value is not None and abs(value - answer) < 1e-9)
    return {"reward": correct, "correct": correct, "answered": float(value is not None)}


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """One turn through the OpenAI SDK: ask the question, score the reply."""
    message = llm.chat([{"role": "user", "content": instance["question"]}])
    return score(message.content, int(instance["answer"]))
