"""echo's agent loops (OpenAI SDK, LangChain, LangGraph, httpx) send the same request: seeded, each records the same step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import experiments.echo as echo
from swarm.client import WorkerConfig
from swarm.client.sdk import SwarmClient
from swarm.client.task import check_options, load_task
from swarm.client.worker import run_one_episode
from swarm.pool import StepFilter
from tests.tiny_gateway import tiny_gateway

LOOPS = ["openai", "langchain", "langgraph", "httpx"]


def test_options_name_the_loop() -> None:
    assert echo.Options().loop == "openai"
    with pytest.raises(ValueError, match=r"task.options.loop=crewai"):
        check_options(load_task("echo"), {"loop": "crewai"})
    with pytest.raises(ValueError, match=r"did you mean task.options.loop\?"):
        check_options(load_task("echo"), {"lop": "httpx"})


def test_every_loop_records_the_same_step(tmp_path: Path, tiny_model_path: Path) -> None:
    task = load_task("echo")
    recorded: dict[str, Any] = {}
    with tiny_gateway(tmp_path, tiny_model_path) as (url, pool):
        cfg = WorkerConfig(server=url, task="echo", temperature=1.0, max_tokens=8, seeded=True)
        with SwarmClient(url) as client:
            for loop in LOOPS:
                echo.Options(loop=loop).use()
                for member in range(3):  # three seeds: the replies differ between members, never between loops
                    run_one_episode(client, task, cfg, seed=7, group_id=f"echo-7-{loop}", member=member)
        for loop in LOOPS:
            steps = pool.query_steps(StepFilter(group_id=f"echo-7-{loop}"), with_tokens=True)
            recorded[loop] = sorted((s.prompt_ids, s.response_ids, [round(x, 4) for x in s.response_logprobs or []])
                                    for s in steps)
    assert len(recorded["openai"]) == 3 and recorded["openai"][0][1], recorded["openai"]
    assert len({tuple(map(str, r)) for r in recorded["openai"]}) > 1, "the seeds should draw different replies"
    for loop in LOOPS[1:]:
        assert recorded[loop] == recorded["openai"], loop
