"""The example verifiers environment shipped with the repo: "say <word>", rubric = exact and similar.

A verifiers v1 taskset built offline (its rows are generated here, nothing is downloaded): row ``i``
asks for one of 16 words, and the task's rubric has two ``@vf.reward`` functions: ``exact`` (weight
0.5; 1 when the reply is the word) and ``similarity`` (weight 0.5; ``difflib`` ratio of the reply to the
word), so the reward lies in [0, 1] and is dense enough for the tiny model. Load it as
``task.options.env=experiments.verifiers.echo_env`` (its Taskset subclass is in ``__all__``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["EchoTaskset"]

WORDS = ("apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "candle",
         "garden", "rocket", "silver", "window", "forest", "button", "planet", "castle")


def _reply(trace: vf.Trace) -> str:
    return (trace.last_reply or "").strip().strip(".!\"'").strip().lower()


class EchoTasksetConfig(vf.TasksetConfig):
    rows: int = 64


class EchoData(vf.TaskData):
    word: str


class EchoTask(vf.Task[EchoData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.5)
    async def exact(self, task: EchoData, trace: vf.Trace) -> float:
        return float(_reply(trace) == task.word)

    @vf.reward(weight=0.5)
    async def similarity(self, task: EchoData, trace: vf.Trace) -> float:
        return difflib.SequenceMatcher(None, _reply(trace), task.word).ratio()


class EchoTaskset(vf.Taskset[EchoTask, EchoTasksetConfig]):
    def load(self) -> Iterator[EchoTask]:
        verbs = ("say", "repeat", "echo")
        for i in range(self.config.rows):
            word = WORDS[i % len(WORDS)]
            yield EchoTask(EchoData(name=f"echo#{i}", prompt=f"{verbs[i % 3]} {word}", word=word), self.config.task)
