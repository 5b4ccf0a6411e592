"""Slow: schemathesis (examples, coverage, fuzzing and stateful phases) against a real gateway on SQLite and
PostgreSQL: no 5xx, and every documented response conforms to /openapi.json.

Runs the installed schemathesis CLI (``st run``, 4.x) in a subprocess against a gateway served on loopback
in this process; a counting ASGI wrapper records the status of every request the server answered.
Budget: ``-n 200`` examples per operation are asked for, bounded by ``--max-time 75`` s per backend
(the CLI splits the time between the phases and stops fuzzing when it is spent). On the 2-core machine
with nothing else running that reached 8,044 cases over 31 operations on SQLite (~260 per operation);
a busy machine gets fewer (30-105 per operation were seen while other test runs shared the cores).
``SWARM_FUZZ_MAX_TIME`` raises the bound.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from swarm.app import GatewaySettings, create_app
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool
from swarm.stack import ServerThread

pytestmark = pytest.mark.slow

MAX_EXAMPLES = 200
MAX_TIME_S = int(os.environ.get("SWARM_FUZZ_MAX_TIME", "45"))  # per backend (~4,000 cases; 75 s before, to fit the suite)


class StatusCounter:
    """ASGI wrapper counting the response status of every HTTP request."""

    def __init__(self, app: Any) -> None:
        self.app, self.statuses = app, Counter()
        self.state = app.state  # ServerThread reads the gateway settings from here

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.statuses[message["status"]] += 1
            await send(message)

        await self.app(scope, receive, counted)


def run_schemathesis(url: str, key: str, report: Path, max_examples: int, max_time_s: int) -> dict[str, Any]:
    """``st run`` over ``url``/openapi.json with every phase; returns the JSON report (plus the CLI's output)."""
    st = shutil.which("st") or str(Path(sys.executable).parent / "st")
    cmd = [st, "run", f"{url}/openapi.json", "--phases", "examples,coverage,fuzzing,stateful",
           "--checks", "not_a_server_error,response_schema_conformance", "-n", str(max_examples),
           "--max-time", str(max_time_s), "-H", f"Authorization: Bearer {key}", "--generation-database", "none",
           "--seed", "1", "-w", "2", "--no-color", "--request-timeout", "30", "--report", "json",
           "--report-json-path", str(report)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max_time_s + 120, cwd=report.parent)
    result = json.loads(report.read_text()) if report.exists() else {}
    result["_full_output"] = proc.stdout + proc.stderr
    result["_output"] = result["_full_output"][-6000:]
    result["_rc"] = proc.returncode
    return result


_NETWORK = ("connection", "timeout", "timed out", "network", "refused", "reset", "unreachable")


def _fuzzer_crashed(output: str) -> bool:
    """Whether the CLI's whole output shows the fuzzer's own data generation failing inside CPython 3.11's
    ``ast.parse`` (hypothesis describing a lambda: "SystemError: AST constructor recursion depth mismatch",
    a CPython 3.11.7 bug), in any phase. The traceback is long: the whole output is searched, not its tail."""
    return "SystemError" in output and ("while generating" in output
                                        or ("AST constructor recursion depth mismatch" in output
                                            and "hypothesis" in output))


def _generation_error(error: Any, crashed: bool) -> bool:
    """An error raised while the fuzzer generated data (inside hypothesis), not by a request: the report
    keeps only a title per error group, so the CLI's output must show the crash (``crashed``:
    :func:`_fuzzer_crashed` of that output) and the title must not be a network error."""
    title = str(error.get("title", "")).lower()
    return crashed and not any(k in title for k in _NETWORK)


def test_schemathesis_finds_no_5xx(pool_url: str, tmp_path: Path) -> None:
    pool = Pool(pool_url)
    app = StatusCounter(create_app(pool, EchoBackend(max_context=4096), GatewaySettings()))
    server = ServerThread(app).start()
    try:
        key = httpx.post(server.url + "/v1/episodes", json={"task": "fuzz"}, timeout=30).json()["api_key"]
        result = run_schemathesis(server.url, key, tmp_path / "report.json", MAX_EXAMPLES, MAX_TIME_S)
    finally:
        server.stop()
        pool.close()
    out = result["_output"]
    # the fuzzer's own data generation can fail inside hypothesis/CPython on our free-form JSON fields
    # (seen twice, in the fuzzing and in the coverage phase: "SystemError: AST constructor recursion depth
    # mismatch"): that says nothing about the gateway, so it is reported, not failed; any other error (a
    # refused connection, a timeout: the server died) fails the test, and so does any 5xx the server sent
    generation_failed = _fuzzer_crashed(result["_full_output"])
    errors = [e for e in result.get("errors") or [] if not _generation_error(e, generation_failed)]
    tolerated = len(result.get("errors") or []) - len(errors) + int(generation_failed)
    assert result.get("failures") == [] and errors == [], out
    assert result["_rc"] == 0 or generation_failed, out
    phases = result["phases"]
    allowed = ("success", "error") if generation_failed else ("success",)
    assert all(phases[p]["status"] in allowed for p in ("coverage", "fuzzing", "stateful")), (phases, out)
    assert result["operations"]["tested"] >= 25 and result["test_cases"]["with_failures"] == 0
    served = sum(app.statuses.values())
    ops = result["operations"]["tested"]
    print(f"schemathesis: {result['test_cases']['generated']} cases over {ops} operations "
          f"({result['test_cases']['generated'] / ops:.0f} per operation), {served} requests served, "
          f"statuses {dict(sorted(app.statuses.items()))}, fuzzer-internal generation errors {tolerated}")
    assert served >= 500, (app.statuses, out)
    assert sum(n for s, n in app.statuses.items() if s >= 500) == 0, app.statuses
