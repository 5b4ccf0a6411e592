"""math: generated arithmetic word problems, solved by a LangChain agent with a calculator tool.

``make_instance(seed)`` builds a problem (:mod:`experiments.math.problems`); ``run_episode``
runs the tool loop (:mod:`experiments.math.agent`) and scores the final number
(:mod:`experiments.math.reward`). The agent's LLM calls all go through ``llm`` (the episode's
base_url + api key); nothing else is contacted.
"""

from __future__ import annotations

from typing import Any

from experiments.math.agent import solve
from experiments.math.calculator import CALCULATOR_TOOL, evaluate, run_calculator
from experiments.math.problems import make_problem
from experiments.math.reward import TOOL_BONUS, math_reward, parse_final_number
from swarm.client import AgentLLM, TaskOptions

__all__ = ["MAX_TURNS", "Options", "make_instance", "run_episode", "math_reward", "parse_final_number", "evaluate",
           "run_calculator", "CALCULATOR_TOOL", "TOOL_BONUS"]

MAX_TURNS = 4


class Options(TaskOptions):
    """``task.options``: none (the task has no knobs, so any key is refused)."""


def make_instance(seed: int) -> dict[str, Any]:
    """``{"seed", "kind", "question", "answer", "max_turns"}``, deterministic in the seed."""
    return {**make_problem(seed), "max_turns": MAX_TURNS}


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """Solve one problem with the calculator loop; returns the reward parts plus ``turns``."""
    trace = solve(instance["question"], llm, max_turns=int(instance.get("max_turns", MAX_TURNS)))
    parts = math_reward(trace.final_text, instance["answer"], trace.tool_ok, trace.tool_errors, trace.tool_calls)
    return {**parts, "turns": float(trace.turns)}
