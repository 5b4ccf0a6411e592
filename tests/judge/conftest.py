"""Judge fixtures: a real gateway on loopback whose ``judge`` policy is a fake upstream LLM API.

The fake upstream is an ``httpx.MockTransport`` behind :class:`swarm.policy.upstream.UpstreamBackend`
(the backend's transport seam): it answers the judge's calls from a script and counts them. The
agents' policy ``default`` is the echo backend. Nothing leaves the process but loopback HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.app import GatewaySettings, create_app
from swarm.client import SwarmClient
from swarm.policy.echo import EchoBackend
from swarm.policy.router import PolicyRouter
from swarm.policy.upstream import UpstreamBackend
from swarm.pool import Pool
from swarm.stack import ServerThread


class FakeJudgeAPI:
    """An OpenAI-compatible chat endpoint replying with ``replies`` in turn (the last one repeats)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        text = self.replies[min(len(self.requests) - 1, len(self.replies) - 1)]
        return httpx.Response(200, json={
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}})


class JudgeStack:
    """Pool + gateway (echo agents, fake judge) + helpers to play a group of episodes."""

    def __init__(self, tmp: Path, api: FakeJudgeAPI, task: str = "t") -> None:
        self.api, self.task = api, task
        self.pool = Pool(f"sqlite:///{tmp / 'pool.db'}")
        judge = UpstreamBackend("http://judge.invalid/v1", api_key="k", policies=["judge"],
                                transport=httpx.MockTransport(api), logprobs=False)
        backend = PolicyRouter([EchoBackend(), judge], frozen=["judge"])
        self.server = ServerThread(create_app(self.pool, backend,
                                              GatewaySettings(reward_authority={task: "judge"}))).start()
        self.url = self.server.url
        self.client = SwarmClient(self.url)

    def play(self, group_id: str, words: list[str], reward: float | None = None, end: bool = True) -> list[Any]:
        """One episode per word in ``group_id``: the agent asks once (echo replies), ends with ``reward``."""
        eps = []
        for w in words:
            ep = self.client.begin(self.task, group_id=group_id)
            ep.openai(max_retries=0).chat.completions.create(
                model="default", messages=[{"role": "user", "content": f"say {w}"}], max_tokens=4)
            if end:
                ep.end(reward=reward)
            eps.append(ep)
        return eps

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        self.pool.close()


@pytest.fixture
def judge_stack(tmp_path: Path) -> Iterator[Callable[[list[str]], JudgeStack]]:
    made: list[JudgeStack] = []

    def make(replies: list[str]) -> JudgeStack:
        s = JudgeStack(tmp_path / str(len(made)), FakeJudgeAPI(replies))
        made.append(s)
        return s

    for i in range(3):
        (tmp_path / str(i)).mkdir()
    yield make
    for s in made:
        s.close()
