"""The gateway next to LiteLLM's proxy, both forwarding to the same null upstream: requests/s and added latency.

Three servers on 127.0.0.1, each its own process:

- the **null upstream**: a bare FastAPI + uvicorn OpenAI-compatible ``/v1/chat/completions`` (JSON and SSE), a fixed
  short reply with vLLM-style ``token_id:<n>`` logprobs and a ``usage`` block; it costs next to nothing;
- **our gateway**: ``python -m flows.serve model=upstream`` on a SQLite pool; every call is recorded durably (the
  step, with the upstream's token ids and logprobs, committed before the answer) under one episode key per client;
- **LiteLLM's proxy** (``litellm --config``, one worker) from ``.venv-litellm`` (``make litellm-venv``), offline:
  ``LITELLM_LOCAL_MODEL_COST_MAP=True``, telemetry off, no database, loopback only.

The same aiohttp clients (1, 8, 32 concurrent; JSON and streamed) call the upstream directly, then the gateway, then
LiteLLM, for ``--duration`` seconds each, and the order alternates over ``--rounds`` so the machine's load falls on all
sides alike. Printed per level: requests/s, p50 latency and the p50 added over calling the upstream directly, and each
server's CPU milliseconds per request. The last line is the ratio of the gateway's requests/s to LiteLLM's.

Run: ``.venv/bin/python benchmarks/proxy_bench.py`` (``--clients 1 8 32 --duration 5 --rounds 2``; ``--against REF`` adds
the gateway as committed at REF as a fourth side, for a before/after in the same run; ``--profile PATH`` samples the
gateway with py-spy in the last round at the largest level and prints its CPU per request by area). Without
``.venv-litellm`` it says so and exits 0. On a 2-core machine the clients share the cores with the servers: both sides
are measured under the same conditions, and the CPU per request is each server's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gateway_bench import AREAS, area_table, cpu_s, export_tree, pct, py_spy  # noqa: E402

LITELLM_VENV = REPO / ".venv-litellm"
MESSAGES = [{"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Please repeat this sentence back to me."}]
REPLY = "Sure: please repeat this sentence back to me."
MODEL = "null-model"
LITELLM_KEY = "sk-bench-" + os.urandom(16).hex()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the null upstream (run as its own process)
def serve_upstream(port: int) -> None:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False})
    pieces = re.findall(r"\S+\s*", REPLY)
    # vLLM-style token strings carry the ids, so the gateway records exact ids and logprobs
    content = [{"token": f"token_id:{100 + i}", "logprob": -0.25, "bytes": list(p.encode()), "top_logprobs": []}
               for i, p in enumerate(pieces)]
    usage = {"prompt_tokens": 24, "completion_tokens": len(pieces), "total_tokens": 24 + len(pieces)}

    async def chat(request: Request) -> Any:
        body = await request.json()
        model = body.get("model", MODEL)
        lp = {"content": content} if body.get("logprobs") else None
        if not body.get("stream"):
            return JSONResponse({"id": "chatcmpl-null", "object": "chat.completion", "created": 0, "model": model,
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY},
                                              "logprobs": lp, "finish_reason": "stop"}], "usage": usage})

        async def events() -> Any:
            for i, p in enumerate(pieces):
                chunk = {"id": "chatcmpl-null", "object": "chat.completion.chunk", "created": 0, "model": model,
                         "choices": [{"index": 0, "delta": {"role": "assistant", "content": p} if i == 0 else
                                      {"content": p}, "logprobs": {"content": [content[i]]} if lp else None,
                                      "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            done = {"id": "chatcmpl-null", "object": "chat.completion.chunk", "created": 0, "model": model,
                    "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]}
            yield f"data: {json.dumps(done)}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                yield f"data: {json.dumps({**done, 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    chat.__annotations__ = {"request": Request}  # a local import: FastAPI cannot resolve the postponed annotation
    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY from asyncio
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


# ---------------------------------------------------------------- servers
class Server:
    def __init__(self, name: str, proc: subprocess.Popen, url: str, log: Path) -> None:
        self.name, self.proc, self.url, self.log = name, proc, url, log

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _wait(name: str, proc: subprocess.Popen, url: str, log: Path, timeout_s: float = 180) -> Server:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=5).status_code < 500:
                return Server(name, proc, url, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    Server(name, proc, url, log).stop()
    raise RuntimeError(f"{name} did not start:\n{log.read_text()[-4000:]}")


def start_upstream(tmp: Path) -> Server:
    port, log = free_port(), tmp / "upstream.log"
    proc = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(port)], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, cwd=REPO)
    server = _wait("upstream", proc, f"http://127.0.0.1:{port}/docs", log)
    server.url = f"http://127.0.0.1:{port}"
    return server


def start_gateway(tmp: Path, upstream: str, repo: Path = REPO, name: str = "gateway") -> Server:
    """``python -m flows.serve model=upstream`` of the tree at ``repo`` (this one, or ``--against``'s export) on its own
    SQLite pool ``<name>.db``."""
    port, log = free_port(), tmp / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if k != "SWARM_POOL_URL"} | {
        "PYTHONPATH": str(repo), "SWARM_UPSTREAM_API_KEY": "null"}
    proc = subprocess.Popen([sys.executable, "-m", "flows.serve", "gateway.host=127.0.0.1", f"gateway.port={port}",
                             "model=upstream", f"model.base_url={upstream}/v1", f"model.model={MODEL}",
                             "model.max_tokens=64", f"pool.url=sqlite:///{tmp / f'{name}.db'}"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=repo, env=env)
    server = _wait(name, proc, f"http://127.0.0.1:{port}/health", log)
    server.url = f"http://127.0.0.1:{port}"
    return server


def start_litellm(tmp: Path, upstream: str) -> Server:
    port, log, cfg = free_port(), tmp / "litellm.log", tmp / "litellm.yaml"
    cfg.write_text(json.dumps({  # YAML is a superset of JSON
        "model_list": [{"model_name": "default", "litellm_params": {
            "model": f"openai/{MODEL}", "api_base": f"{upstream}/v1", "api_key": "null"}}],
        "litellm_settings": {"telemetry": False, "drop_params": True, "set_verbose": False},
        # a master key (checked on every call, as the gateway checks its episode keys); no database
        "general_settings": {"disable_spend_logs": True, "master_key": LITELLM_KEY}}))
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "OPENAI_API_KEY")} | {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_TELEMETRY": "False", "LITELLM_LOG": "ERROR",
        "DO_NOT_TRACK": "true", "DISABLE_ADMIN_UI": "True", "NO_PROXY": "*", "HOME": str(tmp)}
    proc = subprocess.Popen([str(LITELLM_VENV / "bin" / "litellm"), "--config", str(cfg), "--host", "127.0.0.1",
                             "--port", str(port), "--num_workers", "1", "--telemetry", "False"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=tmp, env=env)
    server = _wait("litellm", proc, f"http://127.0.0.1:{port}/health/liveliness", log)
    server.url = f"http://127.0.0.1:{port}"
    return server


# ---------------------------------------------------------------- load (in a separate process)
async def _client(http: Any, key: str | None, stream: bool, stop_at: float, lat: list[float]) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "default" if key != "direct" else MODEL, "messages": MESSAGES, "max_tokens": 64}
    if key == "direct":
        headers = {}
    if stream:
        body |= {"stream": True}
    while time.perf_counter() < stop_at:
        t = time.perf_counter()
        async with http.post("/v1/chat/completions", json=body, headers=headers) as r:
            if r.status != 200:
                raise RuntimeError(f"{r.status}: {await r.text()}")
            if stream:
                text = (await r.read()).decode()
                if "[DONE]" not in text:
                    raise RuntimeError(f"a stream without [DONE]: {text[-300:]}")
            else:
                out = await r.json()
                if out["choices"][0]["message"]["content"] != REPLY:
                    raise RuntimeError(f"unexpected answer: {out}")
        lat.append(time.perf_counter() - t)


def _load_proc(url: str, keys: list[str | None], stream: bool, duration: float, ready: Any, q: Any) -> None:
    import aiohttp

    async def run() -> list[float]:
        lat: list[float] = []
        async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=0)) as http:
            for _ in range(2):  # warm the connections
                await _client(http, keys[0], stream, time.perf_counter() + 0.2, [])
            ready.wait()
            stop = time.perf_counter() + duration
            await asyncio.gather(*[_client(http, k, stream, stop, lat) for k in keys])
        return lat

    try:
        q.put(("ok", asyncio.run(run())))
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        ready.abort()  # the parent waits on the barrier: it must not wait for a start that will not come
        q.put(("error", f"{type(exc).__name__}: {exc}"))


# the upstream path's own areas first (innermost frame wins), then the gateway bench's
PROXY_AREAS = [("upstream HTTP client", r"\(httpx/|\(httpcore/|\(aiohttp/|\(httpx_aiohttp/|\(yarl/|\(multidict/|"
                                        r"\(swarm/policy/_http\.py"),
               ("stream relay (SSE)", r"\(swarm/gateway/streaming\.py|\(swarm/policy/_upstream_reply\.py")] + AREAS


def measure(server: Server, keys: list[str | None], stream: bool, duration: float,
            profile: Path | None = None) -> dict[str, float]:
    """requests/s, p50 / p99 ms and the server's CPU-ms a request; ``profile``: py-spy the server (raw stacks there)."""
    ctx = mp.get_context("spawn")
    q, ready = ctx.Queue(), ctx.Barrier(2)
    w = ctx.Process(target=_load_proc, args=(server.url, keys, stream, duration, ready, q))
    w.start()
    try:
        ready.wait(timeout=120)
    except threading.BrokenBarrierError:
        status, err = q.get(timeout=30)
        raise RuntimeError(f"{server.name}: the load did not start: {err}") from None
    with py_spy(server.proc.pid, duration, profile):
        c0, t0 = cpu_s(psutil.Process(server.proc.pid)), time.perf_counter()
        status, lat = q.get(timeout=duration + 120)
        secs, cpu = time.perf_counter() - t0, cpu_s(psutil.Process(server.proc.pid)) - c0
        w.join()
    if status != "ok":
        raise RuntimeError(f"{server.name}: {lat}")
    return {"rps": len(lat) / secs, "p50": pct(lat, 0.5) * 1e3, "p99": pct(lat, 0.99) * 1e3,
            "cpu_ms": 1e3 * cpu / max(len(lat), 1), "n": len(lat)}


def episode_keys(url: str, n: int) -> list[str]:
    import httpx

    return [httpx.post(f"{url}/v1/episodes", json={"task": "proxy-bench"}, timeout=30).json()["api_key"]
            for _ in range(n)]


def recorded(pool: Path) -> tuple[int, int]:
    """(steps in the pool, those with token ids and logprobs)."""
    from swarm.pool import Pool, StepFilter

    p = Pool(f"sqlite:///{pool}")
    try:
        steps = p.query_steps(StepFilter(task="proxy-bench"), limit=10_000_000, with_tokens=True)
    finally:
        p.close()
    return len(steps), sum(1 for s in steps if s.response_ids and s.response_logprobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="*", default=[1, 8, 32])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per side, level and mode")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the sides' order")
    ap.add_argument("--modes", nargs="*", default=["json", "stream"], choices=["json", "stream"])
    ap.add_argument("--against", metavar="REF", help="also run the gateway as committed at this git ref (its own pool), "
                    "alternated with the others: a before/after of the gateway in the same run")
    ap.add_argument("--profile", metavar="PATH", help="py-spy the gateway in the last round at the largest clients level: "
                    "raw stacks to PATH.<mode>, and a table of its CPU per request by area (PROXY_AREAS)")
    ap.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_upstream:
        return serve_upstream(args.serve_upstream)
    if not (LITELLM_VENV / "bin" / "litellm").exists():
        print(f"proxy_bench: skipped: {LITELLM_VENV.name} is missing (make litellm-venv installs LiteLLM's proxy)")
        return

    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp_s:
        tmp = Path(tmp_s)
        servers: list[Server] = []
        try:
            upstream = start_upstream(tmp)
            servers.append(upstream)
            gateway = start_gateway(tmp, upstream.url)
            servers.append(gateway)
            litellm = start_litellm(tmp, upstream.url)
            servers.append(litellm)
            keys = episode_keys(gateway.url, max(args.clients))
            sides = {"direct": (upstream, ["direct"]), "gateway": (gateway, keys), "litellm": (litellm, [LITELLM_KEY])}
            if args.against:
                before = start_gateway(tmp, upstream.url, export_tree(args.against, tmp / "against"), "before")
                servers.append(before)
                sides["before"] = (before, episode_keys(before.url, max(args.clients)))
            res: dict[tuple[str, str, int], list[dict[str, float]]] = {}
            for r in range(args.rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                for mode in args.modes:
                    for n in args.clients:
                        for name in order:
                            server, ks = sides[name]
                            use = (ks * n)[:n] if name not in ("gateway", "before") else ks[:n]
                            prof = (Path(f"{args.profile}.{mode}") if args.profile and name == "gateway"
                                    and r == args.rounds - 1 and n == max(args.clients) else None)
                            res.setdefault((name, mode, n), []).append(
                                measure(server, use, mode == "stream", args.duration, prof))
            stored, exact = recorded(tmp / "gateway.db")
        finally:
            for s in reversed(servers):
                s.stop()

    total = sum(int(m["n"]) for (name, _, _), ms in res.items() if name == "gateway" for m in ms)
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs (load avg {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}), python "
          f"{sys.version.split()[0]}; LiteLLM {_litellm_version()}; {args.rounds} round(s) x {args.duration:.0f} s "
          "per side, level and mode, sides alternated")
    print(f"gateway: {stored} steps recorded in the pool for {total} answered calls, {exact} with token ids and "
          "logprobs")
    if stored < total:
        raise SystemExit("the gateway answered calls it did not record")

    def mean(name: str, mode: str, n: int, key: str) -> float:
        return statistics.mean(m[key] for m in res[(name, mode, n)])

    print(f"{'mode':6s} {'clients':>7s} {'side':8s} {'req/s':>8s} {'p50 ms':>8s} {'added':>8s} {'p99 ms':>8s} "
          f"{'CPU-ms/req':>10s}")
    ratios = []
    for mode in args.modes:
        for n in args.clients:
            for name in sides:
                p50 = mean(name, mode, n, "p50")
                added = p50 - mean("direct", mode, n, "p50")
                print(f"{mode:6s} {n:7d} {name:8s} {mean(name, mode, n, 'rps'):8.1f} {p50:8.2f} "
                      f"{'' if name == 'direct' else f'{added:+8.2f}':>8s} {mean(name, mode, n, 'p99'):8.2f} "
                      f"{mean(name, mode, n, 'cpu_ms'):10.2f}")
            ratios.append((mode, n, mean("gateway", mode, n, "rps") / mean("litellm", mode, n, "rps")))
    if args.against:
        print(f"gateway {args.against} -> this tree, requests/s: " + ", ".join(
            f"{m} {n}: {mean('before', m, n, 'rps'):.0f} -> {mean('gateway', m, n, 'rps'):.0f}, CPU-ms/req "
            f"{mean('before', m, n, 'cpu_ms'):.2f} -> {mean('gateway', m, n, 'cpu_ms'):.2f}"
            for m in args.modes for n in args.clients))
    for mode in args.modes if args.profile else []:
        cpu_ms = res[("gateway", mode, max(args.clients))][-1]["cpu_ms"]
        print(f"gateway CPU by area, {mode}, {max(args.clients)} clients, last round ({cpu_ms:.2f} CPU-ms/req; "
              f"py-spy stacks in {args.profile}.{mode}):")
        print(area_table(Path(f"{args.profile}.{mode}").read_text(), cpu_ms, PROXY_AREAS, unit="req"))
    one = min(args.clients)
    added_g = {m: mean("gateway", m, one, "p50") - mean("direct", m, one, "p50") for m in args.modes}
    added_l = {m: mean("litellm", m, one, "p50") - mean("direct", m, one, "p50") for m in args.modes}
    geo = statistics.geometric_mean([r for _, _, r in ratios])
    print("ratio, gateway / LiteLLM requests/s: " + ", ".join(f"{m} {n}: x{r:.1f}" for m, n, r in ratios)
          + f" (geometric mean x{geo:.1f}); p50 added at {one} client: gateway "
          + ", ".join(f"{m} {v:+.2f} ms" for m, v in added_g.items()) + ", LiteLLM "
          + ", ".join(f"{m} {v:+.2f} ms" for m, v in added_l.items()))


def _litellm_version() -> str:
    out = subprocess.run([str(LITELLM_VENV / "bin" / "python"), "-c",
                          "import importlib.metadata as m; print(m.version('litellm'))"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    main()
