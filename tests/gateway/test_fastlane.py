"""The fast lane (swarm/gateway/fastlane.py): hot routes served without FastAPI's layers, with FastAPI's exact answers.

Each request, good or hostile, goes to two real gateways on loopback, one with the lane and one without; the status
and the error object must be the same, and only well-formed calls may be served by the lane.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.app import GatewaySettings, create_app
from swarm.gateway.hostile import FORGE, SURROGATE
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool, StepFilter
from swarm.stack import ServerThread

LIMIT = 64 * 1024


class Side:
    def __init__(self, tmp: Path, name: str, lane: bool) -> None:
        self.pool = Pool(f"sqlite:///{tmp / f'{name}.db'}")
        self.app = create_app(self.pool, EchoBackend(), GatewaySettings(max_body_bytes=LIMIT))
        if not lane:
            self.app.fast_lane = None
        self.server = ServerThread(self.app).start()
        self.http = httpx.Client(base_url=self.server.url, timeout=30)
        ep = self.http.post("/v1/episodes", json={"task": "lane"}).json()
        self.episode, self.key = ep["episode_id"], ep["api_key"]
        if lane:
            self.app.fast_lane.served = 0

    def send(self, path: str, body: Any = None, raw: bytes | None = None, key: str | None = "own",
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        h = {"content-type": "application/json", **(headers or {})}
        if key == "own":
            h["authorization"] = f"Bearer {self.key}"
        elif key is not None:
            h["authorization"] = f"Bearer {key}"
        content = raw if raw is not None else json.dumps(body).encode()
        r = self.http.post(path.replace("{ep}", self.episode), content=content, headers=h)
        try:
            out = r.json()
        except ValueError:
            out = r.text
        return r.status_code, json.loads(json.dumps(out).replace(self.episode, "<ep>"))

    def close(self) -> None:
        self.http.close()
        self.server.stop()
        self.pool.close()


@pytest.fixture
def sides(tmp_path: Path) -> Iterator[tuple[Side, Side]]:
    lane, plain = Side(tmp_path, "lane", True), Side(tmp_path, "plain", False)
    yield lane, plain
    lane.close()
    plain.close()


CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"raw": b'{"model": "default", "messages": ['}),
    ("/v1/chat/completions", {"raw": b'{"model": "default", "messages": [{"role": "user", "content": "x"}], '
                                     b'"temperature": NaN}'}),
    ("/v1/chat/completions", {"raw": json.dumps({**CHAT, "messages": [{"role": "user", "content": SURROGATE}]})
                              .encode()}),
    ("/v1/chat/completions", {"body": {**CHAT, "messages": []}}),
    ("/v1/chat/completions", {"body": {**CHAT, "extra": json.loads("[" * 100 + "]" * 100)}}),
    ("/v1/chat/completions", {"body": CHAT, "key": None}),
    ("/v1/chat/completions", {"body": CHAT, "key": "sk-swarm-forged"}),
    ("/v1/chat/completions", {"body": CHAT, "key": "not-a-key"}),
    ("/v1/chat/completions", {"body": {**CHAT, "model": "nope"}}),
    ("/v1/chat/completions", {"body": {**CHAT, "max_tokens": 10**9}}),
    ("/v1/chat/completions", {"body": {**CHAT, "n": 99}}),
    ("/v1/chat/completions", {"body": [CHAT]}),
    ("/v1/chat/completions", {"body": CHAT, "headers": {"content-type": "text/plain"}}),
    ("/v1/chat/completions", {"body": CHAT, "headers": {"host": "evil.example"}}),
    ("/v1/chat/completions", {"raw": json.dumps({**CHAT, "pad": "x" * (LIMIT + 10)}).encode()}),
    ("/v1/episodes", {"body": {"task": "t", "unknown": 1}, "key": None}),
    ("/v1/episodes", {"body": {"task": "\u0000"}, "key": None}),
    ("/v1/episodes", {"body": {"task": "t", "timeout_s": 10**9}, "key": None}),
    ("/v1/episodes/{ep}/end", {"body": {"reward": "high"}}),
    ("/v1/episodes/{ep}/end", {"body": {"metadata": {"x": "\u0000"}}}),
    ("/v1/episodes/other-episode/end", {"body": {"reward": 1.0}}),
    ("/v1/episodes/{ep}/end", {"body": {"reward": 1.0}, "key": None}),
]


@pytest.mark.parametrize("path,case", REFUSED, ids=[f"{p} {i}" for i, (p, _) in enumerate(REFUSED)])
def test_refusals_are_fastapis(sides: tuple[Side, Side], path: str, case: dict[str, Any]) -> None:
    lane, plain = sides
    got, want = lane.send(path, **case), plain.send(path, **case)
    assert got == want
    assert got[0] >= 400, got


def test_calls_opens_and_ends_are_served_by_the_lane_alike(sides: tuple[Side, Side]) -> None:
    lane, plain = sides
    answers = []
    for side in (lane, plain):
        msgs = [{"role": "system", "content": FORGE}, {"role": "user", "content": "say hi"}]
        steps = []
        for turn in range(3):
            status, out = side.send("/v1/chat/completions", {"model": "default", "messages": msgs, "max_tokens": 16})
            assert status == 200, out
            steps.append(out["swarm"]["step_id"])
            msgs += [out["choices"][0]["message"], {"role": "user", "content": f"turn {turn}"}]
        status, stream = 200, side.http.post("/v1/chat/completions", headers={"authorization": f"Bearer {side.key}"},
                                             json={**CHAT, "stream": True}).text
        assert stream.rstrip().endswith("data: [DONE]")
        status, end = side.send("/v1/episodes/{ep}/end", {"reward": 1.0})
        assert status == 200 and end["status"] == "finished", end
        again = side.send("/v1/episodes/{ep}/end", {"reward": 1.0})
        after = side.send("/v1/chat/completions", CHAT)
        stored = side.pool.query_steps(StepFilter(episode_id=side.episode), with_tokens=True, order="episode")
        assert [s.step_id for s in stored][:3] == steps
        assert all(s.prefix_consistent for s in stored[1:3])
        answers.append((msgs[1::2], [(s.prompt_ids, s.response_ids, s.response_logprobs) for s in stored],
                        {k: end[k] for k in ("status", "reward", "reward_status")}, again, after))
    assert answers[0] == answers[1]
    # three calls, a stream, the end, then the route's own refusals (a second end: 409; a call after it: 403)
    assert lane.app.fast_lane.served == 7
    assert plain.app.fast_lane is None


def test_middleware_added_later_turns_the_lane_off(sides: tuple[Side, Side]) -> None:
    lane, _ = sides
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"", "headers": []}
    assert lane.app.fast_lane.wants(scope)
    assert not lane.app.fast_lane.wants({**scope, "query_string": b"x=1"})  # FastAPI's path, as any unusual request
    assert not lane.app.fast_lane.wants({**scope, "path": "/v1/episodes/e/heartbeat"})
    lane.app.dependency_overrides[object] = object
    assert not lane.app.fast_lane.wants(scope)
    lane.app.dependency_overrides.clear()
    lane.app.user_middleware.append(object())
    assert not lane.app.fast_lane.wants(scope)
    lane.app.user_middleware.pop()
