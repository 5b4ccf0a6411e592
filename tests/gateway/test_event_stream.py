"""EventStream (swarm/gateway/streaming.py): a streamed response whose client is watched by one plain asyncio task.

A client that goes away ends the response quietly (its body closed: the backend stops sampling); the server's own
cancellation (shutdown) is never swallowed, also when the client goes at the same moment.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from swarm.gateway.streaming import EventStream

SCOPE = {"type": "http", "asgi": {"spec_version": "2.3"}}


def _run(disconnect: bool, server_cancel: bool) -> tuple[str, bool, list[Any]]:
    """How the response's task ended, whether its body was closed, and what it sent."""
    closed, sent = [False], []
    gone = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        try:
            yield b"data: 1\n\n"
            await asyncio.sleep(30)  # a held-back tool call: nothing is sent meanwhile
            yield b"data: 2\n\n"
        finally:
            closed[0] = True

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> str:
        task = asyncio.ensure_future(EventStream(body(), media_type="text/event-stream")(SCOPE, receive, send))
        await asyncio.sleep(0.05)
        if disconnect:
            gone.set()
        if server_cancel:
            task.cancel()
        try:
            await asyncio.wait_for(task, 5)
        except asyncio.CancelledError:
            return "cancelled"
        return "returned"

    return asyncio.run(main()), closed[0], sent


@pytest.mark.parametrize(("disconnect", "server_cancel", "ends"), [
    (True, False, "returned"), (False, True, "cancelled"), (True, True, "cancelled")])
def test_a_gone_client_ends_the_stream_and_the_servers_cancellation_goes_on(disconnect: bool, server_cancel: bool,
                                                                            ends: str) -> None:
    how, closed, sent = _run(disconnect, server_cancel)
    assert how == ends
    assert closed  # the body (and with it the backend's stream) was closed
    assert [m.get("body") for m in sent[1:]] == [b"data: 1\n\n"]  # nothing after the client went
