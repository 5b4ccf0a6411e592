"""Waiting on a flow that runs in a test's thread: poll a condition while the flow is alive, and a gateway's health."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx


def wait_for(cond: Any, timeout: float, what: str, flow: threading.Thread, poll_s: float = 0.2) -> Any:
    """``cond()``'s first truthy value; fails if the flow ends first or ``timeout`` passes."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        assert flow.is_alive(), f"the flow ended while waiting for {what}"
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def health(url: str) -> dict[str, Any] | None:
    """The gateway's ``/health`` body, None while it does not answer."""
    try:
        return httpx.get(f"{url}/health", timeout=2).json()
    except httpx.HTTPError:
        return None
