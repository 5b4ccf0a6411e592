"""Benchmark (not a test): the gateway's reliability figures per pool backend, bounded, loopback only.

For SQLite and (when ``SWARM_TEST_POSTGRES_URL`` or ``--postgres-url`` answers) PostgreSQL:

- ``fuzz``: schemathesis (``st run``: examples, coverage, fuzzing and stateful phases, ``-n`` examples per
  operation bounded by ``--max-time``) against a gateway served in this process; requests the server
  answered and how many were 5xx (counted by the server, not by the fuzzer).
- ``memory``: one valid ``POST /v1/steps`` of ``--body-mib`` MiB (dense 4-digit token ids, the worst case
  we know) to a ``python -m flows.serve model=echo`` subprocess; its peak RSS growth (``VmHWM``) / body.
- ``slowloris``: a client sending a request head a byte every 0.1 s is closed after ``timeout_request_head_s``
  (2 s here) while ``/health`` calls go on; ``limit``: with ``limit_concurrency=4`` and three requests held
  open, the next call's status and latency, and the status once they are gone.

    .venv/bin/python benchmarks/reliability_bench.py [--max-examples 200] [--max-time 120] [--body-mib 16]

Prints one line per backend and figure, then ``reliability: 5xx / requests = <r>, peak memory / body =
<f>x, slowloris closed after <t> s, over the limit: <status>``. Rerunnable: every run uses fresh pools.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
for _k, _v in {"DO_NOT_TRACK": "true", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
    os.environ.setdefault(_k, _v)

from flows.serve import spawn  # noqa: E402
from swarm.gateway import GatewaySettings, create_app  # noqa: E402
from swarm.policy.echo import EchoBackend  # noqa: E402
from swarm.pool import Pool  # noqa: E402
from swarm.stack import ServerThread  # noqa: E402


class StatusCounter:
    """ASGI wrapper counting the response status of every HTTP request."""

    def __init__(self, app: Any) -> None:
        self.app, self.statuses, self.state = app, Counter(), app.state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.statuses[message["status"]] += 1
            await send(message)

        await self.app(scope, receive, counted if scope["type"] == "http" else send)


@contextlib.contextmanager
def fresh_postgres(url: str) -> Iterator[str]:
    """An empty database on the server of ``url``, dropped afterwards."""
    import sqlalchemy as sa

    name = f"swarm_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.engine.make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def fuzz(pool_url: str, max_examples: int, max_time_s: int, work: Path) -> dict[str, Any]:
    """schemathesis over every phase; the server's own count of requests and 5xx."""
    pool = Pool(pool_url)
    app = StatusCounter(create_app(pool, EchoBackend(max_context=4096), GatewaySettings()))
    server = ServerThread(app).start()
    try:
        key = httpx.post(server.url + "/v1/episodes", json={"task": "fuzz"}, timeout=30).json()["api_key"]
        st = shutil.which("st") or str(Path(sys.executable).parent / "st")
        report = work / f"st-{uuid.uuid4().hex[:6]}.json"
        t0 = time.monotonic()
        proc = subprocess.run([st, "run", f"{server.url}/openapi.json", "--phases", "examples,coverage,fuzzing,stateful",
                               "--checks", "not_a_server_error,response_schema_conformance", "-n", str(max_examples),
                               "--max-time", str(max_time_s), "-H", f"Authorization: Bearer {key}",
                               "--generation-database", "none", "--seed", "1", "-w", "2", "--no-color",
                               "--report", "json", "--report-json-path", str(report)],
                              capture_output=True, text=True, timeout=max_time_s + 300, cwd=work)
        took = time.monotonic() - t0
    finally:
        server.stop()
        pool.close()
    rep = json.loads(report.read_text()) if report.exists() else {}
    return {"requests": sum(app.statuses.values()), "5xx": sum(n for s, n in app.statuses.items() if s >= 500),
            "cases": rep.get("test_cases", {}).get("generated"), "failures": len(rep.get("failures", [0])),
            "rc": proc.returncode, "seconds": took,
            "phases": {k: v["status"] for k, v in rep.get("phases", {}).items()}}


def peak_rss(pid: int) -> int:
    m = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) * 1024 if m else 0


def memory(pool_url: str, body_mib: float) -> dict[str, float]:
    """Peak RSS growth of a flows.serve process for one white-box body of ``body_mib`` MiB."""
    rng = random.Random(0)
    n_steps = 16
    per = int(body_mib * 1024 * 1024 / 5 / n_steps / 2)
    steps = [{"policy": "x", "prompt_ids": [rng.randrange(1000, 10000) for _ in range(per)],
              "response_ids": [rng.randrange(1000, 10000) for _ in range(per)]} for _ in range(n_steps)]
    body = json.dumps({"steps": steps}, separators=(",", ":")).encode()
    del steps
    gw = spawn("model=echo", f"pool.url={pool_url}")
    try:
        key = httpx.post(gw.url + "/v1/episodes", json={"task": "t"}, timeout=30).json()["api_key"]
        httpx.get(gw.url + "/v1/pool/stats", timeout=30)
        before = peak_rss(gw.proc.pid)
        t0 = time.monotonic()
        r = httpx.post(gw.url + "/v1/steps", content=body, timeout=600,
                       headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        took = time.monotonic() - t0
        growth = peak_rss(gw.proc.pid) - before
    finally:
        gw.stop()
    return {"status": r.status_code, "body_mib": len(body) / 2**20, "growth_mib": growth / 2**20,
            "factor": growth / len(body), "seconds": took}


def connections(pool_url: str) -> dict[str, Any]:
    """A slowloris client and the concurrency limit against one gateway with short timeouts."""
    pool = Pool(pool_url)
    settings = GatewaySettings(timeout_request_head_s=2.0, timeout_keep_alive_s=3.0, limit_concurrency=4)
    server = ServerThread(create_app(pool, EchoBackend(), settings)).start()
    out: dict[str, Any] = {}
    try:
        head = b"POST /v1/steps HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 1000
        ok = calls = 0
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.settimeout(0.1)
            t0 = time.monotonic()
            closed_after = None
            for i in range(len(head)):
                try:
                    s.send(head[i:i + 1])
                    if s.recv(4096) == b"":
                        closed_after = time.monotonic() - t0
                except TimeoutError:
                    pass
                except (ConnectionResetError, BrokenPipeError):
                    closed_after = time.monotonic() - t0
                if closed_after is not None or time.monotonic() - t0 > 30:
                    break
                if i % 3 == 0:
                    calls += 1
                    ok += httpx.get(server.url + "/health", timeout=5).status_code == 200
        out.update(slowloris_closed_after_s=closed_after, health_ok=ok, health_calls=calls)
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(3)]
        try:
            for h in held:
                h.sendall(b"POST /v1/episodes HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            time.sleep(0.3)
            t0 = time.monotonic()
            status = httpx.get(server.url + "/health", timeout=30).status_code
            out.update(over_limit_status=status, over_limit_ms=(time.monotonic() - t0) * 1000)
        finally:
            for h in held:
                h.close()
        time.sleep(0.3)
        out["after_status"] = httpx.get(server.url + "/health", timeout=30).status_code
    finally:
        server.stop()
        pool.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-examples", type=int, default=200)
    ap.add_argument("--max-time", type=int, default=120, help="schemathesis budget per backend, seconds")
    ap.add_argument("--body-mib", type=float, default=16.0)
    ap.add_argument("--postgres-url", default=os.environ.get("SWARM_TEST_POSTGRES_URL"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="reliability-bench-"))
    backends: list[tuple[str, Any]] = [("sqlite", None)]
    if args.postgres_url:
        try:
            import sqlalchemy as sa

            sa.create_engine(args.postgres_url).connect().close()
            backends.append(("postgres", args.postgres_url))
        except Exception as exc:  # an unreachable server: report it, run SQLite only
            print(f"postgres: skipped ({type(exc).__name__}: {str(exc)[:120]})")
    totals = Counter()
    factors, closes, limits = [], [], []
    for name, pg in backends:
        for figure in ("fuzz", "memory", "connections"):
            with (fresh_postgres(pg) if pg else contextlib.nullcontext(f"sqlite:///{work / uuid.uuid4().hex}.db")) as url:
                if figure == "fuzz":
                    r = fuzz(url, args.max_examples, args.max_time, work)
                    totals["requests"] += r["requests"]
                    totals["5xx"] += r["5xx"]
                    print(f"{name:8s} fuzz: {r['requests']} requests ({r['cases']} cases, phases {r['phases']}), "
                          f"5xx {r['5xx']}, schemathesis failures {r['failures']}, rc {r['rc']}, {r['seconds']:.0f} s")
                elif figure == "memory":
                    r = memory(url, args.body_mib)
                    factors.append(r["factor"])
                    print(f"{name:8s} memory: {r['body_mib']:.1f} MiB white-box body -> status {r['status']}, "
                          f"peak RSS +{r['growth_mib']:.0f} MiB = {r['factor']:.1f}x the body, {r['seconds']:.1f} s")
                else:
                    r = connections(url)
                    closes.append(r["slowloris_closed_after_s"])
                    limits.append(r["over_limit_status"])
                    print(f"{name:8s} slowloris: closed after {r['slowloris_closed_after_s']:.1f} s (head timeout 2 s), "
                          f"/health {r['health_ok']}/{r['health_calls']} ok meanwhile; over limit_concurrency=4: "
                          f"{r['over_limit_status']} in {r['over_limit_ms']:.0f} ms, then {r['after_status']}")
    print(f"reliability: 5xx / requests = {totals['5xx']}/{totals['requests']} = "
          f"{totals['5xx'] / max(totals['requests'], 1):.4f}, peak memory / body = {max(factors):.1f}x (worst), "
          f"slowloris closed after {max(c or 0 for c in closes):.1f} s, over the limit: {sorted(set(limits))}")


if __name__ == "__main__":
    main()
