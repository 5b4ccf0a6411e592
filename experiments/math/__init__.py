"""math: generated arithmetic word problems, solved by a LangChain agent with a calculator tool.

``make_instance(seed)`` builds a problem (:mod:`experiments.math.problems`); ``run_episode``
runs the tool loop (:mod:`experiments.math.agent`) and scores the final number
(:mod:`experiments.math.reward`). The agent's LLM calls all go through ``llm`` (the episode's
base_url + api key); nothing else is contacted.
"""

from __future__ import annotations

from typing import Any, Literal

from experiments.math.agent import solve
from experiments.math.calculator import CALCULATOR_TOOL, evaluate, run_calculator
from experiments.math.problems import EVAL_SEED_BASE, make_calc_problem, make_problem
from experiments.math.reward import TOOL_BONUS, math_reward, parse_final_number
from swarm.client import AgentLLM, TaskOptions

__all__ = ["EVAL_SEED_BASE", "MAX_TURNS", "Options", "make_instance", "run_episode", "math_reward",
           "parse_final_number", "evaluate", "run_calculator", "CALCULATOR_TOOL", "TOOL_BONUS"]

MAX_TURNS = 4


class Options(TaskOptions):
    """``task.options``: ``problems`` ``words`` (the word problems) or ``calc`` ("What is 47 * 38 + 15?": the
    tool is needed, the words are few; a held-out quarter by hash, drawn from seeds >= ``EVAL_SEED_BASE``);
    ``first_tool_call``: the agent's first call names the calculator in ``tool_choice``."""

    problems: Literal["words", "calc"] = "words"
    first_tool_call: bool = False


def make_instance(seed: int) -> dict[str, Any]:
    """``{"seed", "kind", "question", "answer", "max_turns"}``, deterministic in the seed."""
    opts = Options.current()
    if opts.problems == "calc":
        problem = make_calc_problem(seed, "eval" if seed >= EVAL_SEED_BASE else "train")
    else:
        problem = make_problem(seed)
    return {**problem, "max_turns": MAX_TURNS, "first_tool_call": opts.first_tool_call}


def run_episode(instance: dict[str, Any], llm: AgentLLM) -> dict[str, float]:
    """Solve one problem with the calculator loop; returns the reward parts plus ``turns``."""
    trace = solve(instance["question"], llm, max_turns=int(instance.get("max_turns", MAX_TURNS)),
                  first_tool_call=bool(instance.get("first_tool_call", False)))
    parts = math_reward(trace.final_text, instance["answer"], trace.tool_ok, trace.tool_errors, trace.tool_calls)
    return {**parts, "turns": float(trace.turns)}
