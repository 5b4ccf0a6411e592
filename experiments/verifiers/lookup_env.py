"""The example multi-turn tool environment shipped with the repo: look a code word up, then say it.

A verifiers v1 environment built offline (rows generated here, nothing downloaded). Row ``i`` names one
of 8 keys ("Find the code word for blue with the lookup tool, then reply with it."); the taskset serves
one tool, ``lookup(key)`` (:mod:`experiments.verifiers.lookup_tools`, an MCP server started once per
serving environment). The environment's ``run()`` is a two-turn exchange through
``agents.agent.interaction(task)``: the seat's first segment (a tool call, its result, a reply), then,
unless that reply is the code word, one feedback turn from the environment ("Not quite: ...") and a
second reply. Rubric: ``looked_up`` (weight 0.5; 1 when a ``lookup`` call named the row's key) and
``answer`` (weight 0.5; ``difflib`` ratio of the last reply to the code word), so the reward is in [0, 1].

The seat declares the in-process harness with ``first_tool_choice="required"`` (the tiny model never
writes a tool call unaided; the gateway's constrained decoding makes the first call a valid one) and
``max_tokens=128`` (the tiny model spells a constrained tool call in 50-70 tokens, one character at a time). Load it as ``task.options.env=experiments.verifiers.lookup_env``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator

import verifiers.v1 as vf

from experiments.verifiers.harness import seat_harness
from experiments.verifiers.lookup_tools import CODES, LookupTools

__all__ = ["LookupEnv", "LookupTaskset"]

KEYS = tuple(CODES)


def _clean(text: str) -> str:
    return text.strip().strip(".!\"'").strip().lower()


def _keys_looked_up(trace: vf.Trace) -> list[str]:
    """The ``key`` argument of every ``lookup`` call in the trace (unparseable calls left out)."""
    keys = []
    for message in trace.assistant_messages:
        for call in message.tool_calls or []:
            try:
                args = json.loads(call.arguments or "{}")
            except json.JSONDecodeError:
                continue
            if call.name == "lookup" and isinstance(args, dict):
                keys.append(str(args.get("key")))
    return keys


class LookupData(vf.TaskData):
    key: str
    code: str


class LookupTask(vf.Task[LookupData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.5)
    async def looked_up(self, task: LookupData, trace: vf.Trace) -> float:
        return float(task.key in _keys_looked_up(trace))

    @vf.reward(weight=0.5)
    async def answer(self, task: LookupData, trace: vf.Trace) -> float:
        return difflib.SequenceMatcher(None, _clean(trace.last_reply), task.code).ratio()


class LookupTasksetConfig(vf.TasksetConfig):
    rows: int = 64
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class LookupTaskset(vf.Taskset[LookupTask, LookupTasksetConfig]):
    @classmethod
    def toolsets(cls, config: LookupTasksetConfig) -> list[vf.Toolset]:
        return [LookupTools(config.tools)]

    def load(self) -> Iterator[LookupTask]:
        for i in range(self.config.rows):
            key = KEYS[i % len(KEYS)]
            prompt = f"Find the code word for {key} with the lookup tool, then reply with it."
            yield LookupTask(LookupData(name=f"lookup#{i}", prompt=prompt, key=key, code=CODES[key]), self.config.task)


class LookupEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(harness=seat_harness(first_tool_choice="required"), max_turns=4,
                                           sampling=vf.SamplingConfig(max_tokens=128))
    feedback_turns: int = 1


class LookupEnv(vf.Env[LookupEnvConfig]):
    async def run(self, task: LookupTask, agents: vf.Agents) -> None:
        async with agents.agent.interaction(task) as chat:
            segment = await chat.turn()
            for _ in range(self.config.feedback_turns):
                if segment.terminated or _clean(segment.last_reply) == task.data.code:
                    break
                segment = await chat.turn(f"Not quite: reply with only the code word for {task.data.key}.")
