"""Connection hygiene on a real gateway: slow heads, slow bodies and silent connections are closed after
their timeouts while normal calls go on; over the concurrency limit and the connection cap the answer is
an immediate 503; refusals are logged at most once per interval."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from swarm.gateway.connections import RateLimitedLog, RateLimitFilter
from swarm.gateway.hostile import trickle

FAST = {"timeout_keep_alive_s": 1.5, "timeout_request_head_s": 1.0, "timeout_request_body_s": 1.5}


@contextmanager
def _raw(url: str) -> Iterator[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        yield s
    finally:
        s.close()


def test_slowloris_head_is_disconnected_while_calls_go_on(make_gateway: Any) -> None:
    gw = make_gateway(**FAST)
    head = b"POST /v1/steps HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 200
    calls = 0

    def health() -> None:  # meanwhile normal calls are served
        nonlocal calls
        assert httpx.get(gw.url + "/health", timeout=5).status_code == 200
        calls += 1

    with _raw(gw.url) as s:  # the head is never finished
        took = trickle(s, head, 0.1, 10, meanwhile=health, meanwhile_every=2)
        assert took is not None and 0.9 <= took < 4, took
        assert calls >= 2
    assert gw.http.get("/health").status_code == 200


def test_a_request_head_over_the_limit_is_a_400_and_its_connection_closed(make_gateway: Any) -> None:
    """llhttp has no head limit of its own: the protocol counts a head's bytes, in one read or in many."""
    gw = make_gateway(max_request_head_bytes=4096)
    line = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    for pieces in (1, 40):  # the whole head at once, then in 40 writes
        head = line + b"X-Pad: " + b"a" * 8000 + b"\r\n\r\n"
        with _raw(gw.url) as s:
            step = -(-len(head) // pieces)
            try:
                for i in range(0, len(head), step):
                    s.sendall(head[i:i + step])
                    time.sleep(0.01)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed before the rest arrived
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 ") and b"request_head_too_large" in answer, answer[:300]
    with _raw(gw.url) as s:  # just under the limit: served
        s.sendall(line + b"X-Pad: " + b"a" * 3000 + b"\r\nConnection: close\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
    assert gw.http.get("/health").status_code == 200


def test_silent_connections_and_slow_bodies_are_closed(make_gateway: Any) -> None:
    gw = make_gateway(**FAST)
    with _raw(gw.url) as idle:  # connects and never says anything
        took = trickle(idle, b"", 0.1, 8)
        assert took is not None and 1.0 <= took < 5, took
    body = b'{"steps": [{"prompt_ids": [1], "response_ids": [2]}]}'
    head = (b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    with _raw(gw.url) as slow:  # a complete head, then the body at ~3 bytes/s
        slow.sendall(head)
        took = trickle(slow, body, 0.3, 8)
        assert took is not None and took < 5, took
    assert gw.http.get("/health").status_code == 200
    # an ordinary client that keeps its connection between calls is unaffected
    with httpx.Client(base_url=gw.url, timeout=5) as c:
        for _ in range(3):
            assert c.post("/v1/episodes", json={"task": "t"}).status_code == 200
            time.sleep(0.5)


def test_over_the_limits_the_answer_is_503_not_a_queue(make_gateway: Any) -> None:
    gw = make_gateway(limit_concurrency=4, max_connections=8, timeout_request_body_s=30)
    head = b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    held = [socket.create_connection(("127.0.0.1", gw.server.port), timeout=10) for _ in range(3)]
    try:
        for s in held:  # three requests in flight, waiting for their bodies
            s.sendall(head)
        time.sleep(0.3)
        t0 = time.monotonic()
        r = httpx.get(gw.url + "/health", timeout=10)
        assert r.status_code == 503 and time.monotonic() - t0 < 2
    finally:
        for s in held:
            s.close()
    deadline = time.monotonic() + 5
    while httpx.get(gw.url + "/health", timeout=10).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # the hard cap: connections past max_connections are answered 503 and closed before being read
    idle = [socket.create_connection(("127.0.0.1", gw.server.port), timeout=10) for _ in range(8)]
    try:
        time.sleep(0.3)
        with _raw(gw.url) as extra:
            extra.settimeout(5)
            reply = extra.recv(4096)
            assert reply.startswith(b"HTTP/1.1 503") and b"too many connections" in reply
            assert extra.recv(4096) == b""
        assert gw.server.server.config.http.events.counts.get("refused", 0) >= 1
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 5
    while True:
        try:
            if httpx.get(gw.url + "/health", timeout=10).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_refusal_logs_are_rate_limited(caplog: Any) -> None:
    logger = logging.getLogger("test.connections")
    events = RateLimitedLog(logger, interval_s=60)
    with caplog.at_level(logging.WARNING, logger="test.connections"):
        for _ in range(1000):
            events.note("refused", "refused a connection")
    assert events.counts["refused"] == 1000 and len(caplog.records) == 1
    flt = RateLimitFilter(("Exceeded concurrency limit.",), interval_s=60)
    recs = [logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, "Exceeded concurrency limit.", None, None)
            for _ in range(500)]
    assert sum(flt.filter(r) for r in recs) == 1
    other = logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1, "something else", None, None)
    assert flt.filter(other)
