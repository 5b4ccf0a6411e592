"""Benchmark (not a test): the gateway's and the trainer's reliability figures per pool backend, bounded,
loopback only.

For SQLite and (when ``SWARM_TEST_POSTGRES_URL`` or ``--postgres-url`` answers) PostgreSQL:

- ``fuzz``: schemathesis (``st run``: examples, coverage, fuzzing and stateful phases, ``-n`` examples per
  operation bounded by ``--max-time``) against a gateway served in this process; requests the server
  answered and how many were 5xx (counted by the server, not by the fuzzer).
- ``memory``: one valid ``POST /v1/steps`` of ``--body-mib`` MiB (dense 4-digit token ids, the worst case
  we know) to a ``python -m flows.serve model=echo`` subprocess; its peak RSS growth (``VmHWM``) / body.
- ``slowloris``: a client sending a request head a byte every 0.1 s is closed after ``timeout_request_head_s``
  (2 s here) while ``/health`` calls go on; ``limit``: with ``limit_concurrency=4`` and three requests held
  open, the next call's status and latency, and the status once they are gone.
- ``poison``: the white-box attempts of :mod:`swarm.gateway.hostile` against a gateway (unstorable inputs:
  NUL, over-long ids, ints >= 2^31, deep or large JSON; token ids outside the vocabulary; a
  ``parent_step_id`` in another episode): refused (4xx) vs stored; chats whose content forges ChatML
  control tokens, which must be recorded as text. Then ``--bypass-bad`` steps with out-of-vocabulary ids
  stored straight into the pool beside good groups go lease -> quarantine -> one real update of the default
  tiny model (as ``flows.run`` does): training crashes (0) and quarantined steps; the same batch without the
  quarantine shows the crash it prevents.
- ``kill9``: ``--kill-rounds`` times a ``flows.serve`` gateway (model=echo) with ``--clients`` agents
  chatting (:mod:`swarm.client.load`) is killed with SIGKILL once ``--kill-after`` steps are acknowledged;
  acknowledged vs stored steps, lost acknowledged steps (0), and whether a restarted gateway serves them.
- ``crash``: :mod:`flows.drill` SIGKILLs ``python -m flows.train`` (tiny model) at each update boundary
  (after the update, after publish, after the checkpoint before the ack, after the settle; restarted at
  once or after the lease TTL, ``--crash-every-delay`` for both at every boundary) and audits the training
  journal: steps trained twice (0). Minutes per backend; ``--skip-crash`` leaves it out.

    .venv/bin/python benchmarks/reliability_bench.py [--max-examples 200] [--max-time 120] [--body-mib 16]
        [--bypass-bad 6] [--kill-rounds 3] [--clients 32] [--kill-after 150] [--crash-every-delay]
        [--skip-crash] [--figures fuzz,memory,connections,poison,kill9,crash]

Prints one line per backend and figure, then ``reliability: 5xx / requests = <r>, peak memory / body =
<f>x, slowloris closed after <t> s, over the limit: <status>, poison stored <s>/<n>, training crashes <c>,
kill -9 lost <l>/<acked>, trained twice <t> (<b> boundaries)`` (the parts of the figures that ran).
Rerunnable: every run uses fresh pools and run directories.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import random
import re
import shutil
import signal
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

from flows.drill import boundary_plan, crash_drill  # noqa: E402
from flows.serve import spawn  # noqa: E402
from flows.shutdown import own_prefect_server  # noqa: E402
from swarm.app import GatewaySettings, create_app  # noqa: E402
from swarm.client.load import load_then  # noqa: E402
from swarm.gateway.hostile import FORGE, out_of_vocab_steps, trickle, unstorable_requests, whitebox  # noqa: E402
from swarm.policy.echo import EchoBackend  # noqa: E402
from swarm.pool import Pool, StepFilter  # noqa: E402
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
        head = b"POST /v1/steps HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 1000
        health: list[bool] = []

        def check_health() -> None:  # ordinary calls while the head trickles in
            health.append(httpx.get(server.url + "/health", timeout=5).status_code == 200)

        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            closed_after = trickle(s, head, 0.1, 30, meanwhile=check_health, meanwhile_every=3)
        out.update(slowloris_closed_after_s=closed_after, health_ok=sum(health), health_calls=len(health))
        held = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(3)]
        try:
            for h in held:
                h.sendall(b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
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


ADMIN_TOKEN = "bench-admin"


def poison(pool_url: str, bypass_bad: int) -> dict[str, Any]:
    """White-box poison attempts against a gateway (swarm.gateway.hostile), then steps stored straight
    into the pool with out-of-vocabulary ids through the trainer's quarantine and one real update."""
    pool = Pool(pool_url)
    backend = EchoBackend(max_context=4096)
    server = ServerThread(create_app(pool, backend, GatewaySettings(admin_token=ADMIN_TOKEN))).start()
    http = httpx.Client(base_url=server.url, timeout=60)

    def post(path: str, key: str | None, body: Any) -> int:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        return http.post(path, content=json.dumps(body).encode(), headers=headers).status_code

    try:
        a, b = (http.post("/v1/episodes", json={"task": "poison"}).json() for _ in range(2))
        statuses = [post(path, k, body) for path, k, body in unstorable_requests(a["api_key"], a["episode_id"],
                                                                                 ADMIN_TOKEN)]
        statuses += [post("/v1/steps", a["api_key"], body) for body in out_of_vocab_steps(backend.vocab_size("default"))]
        own = http.post("/v1/steps", json=whitebox(), headers={"Authorization": f"Bearer {a['api_key']}"})
        statuses.append(post("/v1/steps", b["api_key"], whitebox(parent_step_id=own.json()["step_ids"][0])))
        legit = 1
        # forged control tokens: accepted, and must be recorded as text (no extra role boundary)
        start_id = backend.encode("default", "<|im_start|>")[0]
        forged = 0
        for msgs in ([{"role": "user", "content": FORGE}],
                     [{"role": "system", "content": FORGE}, {"role": "user", "content": "x"}],
                     [{"role": "user", "content": [{"type": "text", "text": FORGE}]}]):
            r = http.post("/v1/chat/completions", json={"model": "default", "messages": msgs, "max_tokens": 2},
                          headers={"Authorization": f"Bearer {a['api_key']}"})
            statuses.append(r.status_code)
            if r.status_code == 200:
                legit += 1
                plain = [{**m, "content": "x"} for m in msgs]
                boundaries = backend.render_chat("default", plain, None, True).count("<|im_start|>")
                step = pool.get_step(r.json()["swarm"]["step_id"])
                forged += step.prompt_ids.count(start_id) != boundaries
        n_refusable = len(statuses) - 3
        reads_ok = http.get("/v1/pool/episodes", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).status_code == 200
        stored_extra = pool.count_steps() - legit  # steps stored beyond the legitimate ones
    finally:
        http.close()
        server.stop()
    out = {"attempts": len(statuses), "refused": sum(400 <= s < 500 for s in statuses[:n_refusable]),
           "5xx": sum(s >= 500 for s in statuses), "forged_as_control": forged, "reads_ok": reads_ok,
           "stored": sum(s < 400 for s in statuses[:n_refusable]) + forged + max(stored_extra, 0)}
    try:
        out.update(bypass(pool, bypass_bad))
    finally:
        pool.close()
    return out


def bypass(pool: Pool, n_bad: int) -> dict[str, Any]:
    """Steps stored straight into the pool (no gateway check): ``n_bad`` with token ids outside the tiny
    model's vocabulary beside good groups; one real update of the default tiny model through the flow's
    update (:func:`swarm.update.run_updates`: wait -> lease -> quarantine -> update -> publish -> settle).
    Also an update of the same steps without the quarantine (the crash it prevents)."""
    import copy

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from swarm.policy.hf import HFSettings
    from swarm.records import Episode, Step
    from swarm.train import Ledger, LoraSpec, TrainConfig, Trainer, items_from_steps
    from swarm.train.quarantine import limits_of
    from swarm.update import UpdateSettings, run_updates

    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(HFSettings(backend="hf", warmup="word_chain").weights(), dtype=torch.float32)
    vocab, _ = limits_of(model)
    bad_ids = [1_000_000, vocab, 2**31 - 1]

    def store(group: str, reward: float, prompt: list[int], response: list[int]) -> None:
        ep = pool.add_episode(Episode(task="bypass", group_id=group))
        pool.add_step(Step(episode_id=ep.episode_id, task="bypass", group_id=group, prompt_ids=prompt,
                           response_ids=response, response_logprobs=[-1.0] * len(response)))
        pool.end_episode(ep.episode_id, reward=reward)

    for i in range(8):  # four groups of two, rewards 0 and 1: a real advantage signal
        store(f"g{i % 4}", float(i // 4), [1, 2, 3 + i, 4], [5 + i, 6, 7])
    for i in range(n_bad):  # the bad id in the prompt or the response, beside good steps of the same group
        bad = bad_ids[i % 3]
        store(f"g{i % 4}", 0.5, [1, bad] if i % 2 else [1, 2], [5] if i % 2 else [5, bad])
    config = TrainConfig(lr=1e-3, lora=LoraSpec(rank=4))
    flt = StepFilter(policy="default", task="bypass")
    stored = pool.query_steps(flt, limit=10_000, with_tokens=True)
    unfiltered = "no crash"
    try:
        Trainer(copy.deepcopy(model), config).update(items_from_steps(stored))
    except Exception as exc:  # the crash the quarantine exists for
        unfiltered = type(exc).__name__
    # every finished episode fires the update, which leases all four groups
    settings = UpdateSettings(strategy="episodes", min_episodes=1, min_groups=1, group_size=1, timeout_s=30,
                              max_staleness=None, curated=StepFilter(task="bypass"))
    ledger = Ledger(Trainer(model, config, out_dir=tempfile.mkdtemp(prefix="bypass-")), pool, ttl_s=60)
    got: dict[str, Any] = {}
    crashes, loss = 0, "no update"
    try:
        run_updates(ledger, settings, 1, on_update=lambda m, steps: got.update(metrics=m, steps=steps))
        loss = got["metrics"]["train/loss"]
    except Exception as exc:  # counted, not raised: this is the figure
        crashes, loss = 1, f"{type(exc).__name__}: {exc}"[:200]
    quarantined = len(pool.query_steps(flt.model_copy(update={"include_excluded": True}), limit=10_000)) - len(
        pool.query_steps(flt, limit=10_000))
    again = len(pool.lease(flt, max_groups=100, ttl_s=1).steps)
    return {"bypass_steps": len(stored), "bypass_bad": n_bad, "quarantined": quarantined,
            "trained": len(got.get("steps", [])), "training_crashes": crashes, "loss": loss,
            "unfiltered": unfiltered, "leased_again": again}


def kill9(pool_url: str, rounds: int, clients: int, after_acked: int) -> dict[str, Any]:
    """``rounds`` times: a ``flows.serve`` gateway (model=echo) on the pool, ``clients`` agents chatting
    (swarm.client.load), kill -9 once ``after_acked`` steps are acknowledged; acknowledged vs stored."""
    env = {"SWARM_GATEWAY_SECRET": f"reliability-bench-{uuid.uuid4().hex}"}
    acked_all: list[str] = []
    lost_per_round = []
    for _ in range(rounds):
        gw = spawn("model=echo", f"pool.url={pool_url}", env=env, timeout_s=60)
        acked: list[str] = []
        try:
            kill = functools.partial(os.kill, gw.proc.pid, signal.SIGKILL)  # mid-flight: calls are generating or storing
            asyncio.run(load_then(gw.url, clients, after_acked, kill, acked))
        finally:
            gw.proc.kill()
            gw.proc.wait()
        acked_all += acked
        pool = Pool(pool_url)
        try:
            stored = {s.step_id for s in pool.query_steps(limit=1_000_000)}
        finally:
            pool.close()
        lost_per_round.append(len(set(acked) - stored))
    gw = spawn("model=echo", f"pool.url={pool_url}", env=env, timeout_s=60)  # the pool serves after the last kill
    try:
        serves = httpx.get(f"{gw.url}/v1/pool/steps/{acked_all[-1]}", timeout=30).status_code
    finally:
        gw.stop()
    return {"rounds": rounds, "acked": len(acked_all), "stored": len(stored), "lost": sum(lost_per_round),
            "lost_per_round": lost_per_round, "serves_after": serves}


def crash(pool_url: str | None, work: Path, every_delay: bool, prefect_env: dict[str, str]) -> dict[str, Any]:
    """flows.drill: SIGKILL ``python -m flows.train`` at each update boundary, restart, audit the journal."""
    tmp = Path(tempfile.mkdtemp(prefix="crash-", dir=work))
    url = pool_url or f"sqlite:///{tmp / 'run' / 'pool.db'}"
    t0 = time.monotonic()
    drill = crash_drill(tmp, uuid.uuid4().hex, boundary_plan(every_delay),
                        overrides=(f"pool.url={url}",) if pool_url else (), env=prefect_env)
    took = time.monotonic() - t0
    pool = Pool(url)
    try:
        consumed = {s.step_id for s in pool.query_steps(StepFilter(consumed=True), limit=1_000_000)}
    finally:
        pool.close()
    kills = [a for a in drill.attempts if a.point is not None]
    final = drill.attempts[-1]
    return {"boundaries": len(kills), "killed": drill.kills, "final_rc": final.rc,
            "tracebacks": sum("Traceback" in a.log for a in drill.attempts),
            "trained_twice": len(drill.audit.get("trained_twice", [])), "updates": drill.audit.get("updates"),
            "planned": drill.updates, "lost_updates": drill.audit.get("lost_updates"),
            "settled_as_trained": consumed == drill.audit.get("step_ids"), "seconds": took, "dir": tmp}


FIGURES = ("fuzz", "memory", "connections", "poison", "kill9", "crash")


def _report(name: str, figure: str, r: dict[str, Any]) -> str:
    if figure == "fuzz":
        return (f"{name:8s} fuzz: {r['requests']} requests ({r['cases']} cases, phases {r['phases']}), "
                f"5xx {r['5xx']}, schemathesis failures {r['failures']}, rc {r['rc']}, {r['seconds']:.0f} s")
    if figure == "memory":
        return (f"{name:8s} memory: {r['body_mib']:.1f} MiB white-box body -> status {r['status']}, "
                f"peak RSS +{r['growth_mib']:.0f} MiB = {r['factor']:.1f}x the body, {r['seconds']:.1f} s")
    if figure == "connections":
        return (f"{name:8s} slowloris: closed after {r['slowloris_closed_after_s']:.1f} s (head timeout 2 s), "
                f"/health {r['health_ok']}/{r['health_calls']} ok meanwhile; over limit_concurrency=4: "
                f"{r['over_limit_status']} in {r['over_limit_ms']:.0f} ms, then {r['after_status']}")
    if figure == "poison":
        loss = r["loss"] if isinstance(r["loss"], str) else f"{r['loss']:.3f}"
        return (f"{name:8s} poison: {r['attempts']} white-box attempts -> {r['refused']} refused (4xx), "
                f"{r['forged_as_control']} forged control tokens kept, stored {r['stored']}, 5xx {r['5xx']}, "
                f"pool reads {'ok' if r['reads_ok'] else 'BROKEN'}; bypassing the gateway: {r['bypass_steps']} "
                f"leased steps ({r['bypass_bad']} out of vocabulary) -> {r['quarantined']} quarantined, "
                f"{r['trained']} trained (loss {loss}), training crashes {r['training_crashes']}, "
                f"quarantined leased again {r['leased_again']} (unquarantined update: {r['unfiltered']})")
    if figure == "kill9":
        return (f"{name:8s} kill -9: {r['rounds']} x flows.serve killed under load -> {r['acked']} acknowledged, "
                f"{r['stored']} stored, lost {r['lost']} (per round {r['lost_per_round']}), "
                f"restarted gateway serves them: {r['serves_after']}")
    return (f"{name:8s} crash: {r['boundaries']} boundaries SIGKILLed ({r['killed']} died there), final run rc "
            f"{r['final_rc']}, tracebacks {r['tracebacks']}; journal: {r['updates']}/{r['planned']} updates, "
            f"{r['lost_updates']} lost to kills, trained twice {r['trained_twice']}, settled = trained: "
            f"{r['settled_as_trained']}, {r['seconds']:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-examples", type=int, default=200)
    ap.add_argument("--max-time", type=int, default=120, help="schemathesis budget per backend, seconds")
    ap.add_argument("--body-mib", type=float, default=16.0)
    ap.add_argument("--bypass-bad", type=int, default=6, help="out-of-vocabulary steps stored around the gateway")
    ap.add_argument("--kill-rounds", type=int, default=3)
    ap.add_argument("--clients", type=int, default=32, help="concurrent agents during each kill -9 round")
    ap.add_argument("--kill-after", type=int, default=150, help="acknowledged steps per round before the kill")
    ap.add_argument("--crash-every-delay", action="store_true",
                    help="kill at each boundary twice (restart at once and after the lease TTL): 8 kills, not 4")
    ap.add_argument("--skip-crash", action="store_true", help="skip the crash boundaries (minutes per backend)")
    ap.add_argument("--figures", default=",".join(FIGURES), help=f"comma-separated subset of {','.join(FIGURES)}")
    ap.add_argument("--postgres-url", default=os.environ.get("SWARM_TEST_POSTGRES_URL"))
    args = ap.parse_args()
    figures = [f for f in args.figures.split(",") if f in FIGURES and not (f == "crash" and args.skip_crash)]
    work = Path(tempfile.mkdtemp(prefix="reliability-bench-"))
    backends: list[tuple[str, Any]] = [("sqlite", None)]
    if args.postgres_url:
        try:
            import sqlalchemy as sa

            sa.create_engine(args.postgres_url).connect().close()
            backends.append(("postgres", args.postgres_url))
        except Exception as exc:  # an unreachable server: report it, run SQLite only
            print(f"postgres: skipped ({type(exc).__name__}: {str(exc)[:120]})")
    res: dict[str, list[dict[str, Any]]] = {f: [] for f in FIGURES}
    with contextlib.ExitStack() as stack:
        prefect_env: dict[str, str] = {}
        if "crash" in figures:  # one Prefect server for every attempt of every drill (its start-up is slow)
            api = stack.enter_context(own_prefect_server())
            prefect_env = {"PREFECT_API_URL": api} if api else {}
        for name, pg in backends:
            for figure in figures:
                with (fresh_postgres(pg) if pg else contextlib.nullcontext(f"sqlite:///{work / uuid.uuid4().hex}.db")
                      ) as url:
                    if figure == "fuzz":
                        r = fuzz(url, args.max_examples, args.max_time, work)
                    elif figure == "memory":
                        r = memory(url, args.body_mib)
                    elif figure == "connections":
                        r = connections(url)
                    elif figure == "poison":
                        r = poison(url, args.bypass_bad)
                    elif figure == "kill9":
                        r = kill9(url, args.kill_rounds, args.clients, args.kill_after)
                    else:
                        r = crash(url if pg else None, work, args.crash_every_delay, prefect_env)
                res[figure].append(r)
                print(_report(name, figure, r), flush=True)
    parts = []
    if res["fuzz"]:
        req, err = sum(r["requests"] for r in res["fuzz"]), sum(r["5xx"] for r in res["fuzz"])
        parts.append(f"5xx / requests = {err}/{req} = {err / max(req, 1):.4f}")
    if res["memory"]:
        parts.append(f"peak memory / body = {max(r['factor'] for r in res['memory']):.1f}x (worst)")
    if res["connections"]:
        closes = [r["slowloris_closed_after_s"] or 0 for r in res["connections"]]
        parts.append(f"slowloris closed after {max(closes):.1f} s, "
                     f"over the limit: {sorted({r['over_limit_status'] for r in res['connections']})}")
    if res["poison"]:
        parts.append(f"poison stored {sum(r['stored'] for r in res['poison'])}/"
                     f"{sum(r['attempts'] for r in res['poison'])}, "
                     f"training crashes {sum(r['training_crashes'] for r in res['poison'])}")
    if res["kill9"]:
        parts.append(f"kill -9 lost {sum(r['lost'] for r in res['kill9'])}/{sum(r['acked'] for r in res['kill9'])}")
    if res["crash"]:
        parts.append(f"trained twice {sum(r['trained_twice'] for r in res['crash'])} "
                     f"({sum(r['boundaries'] for r in res['crash'])} boundaries)")
    print("reliability: " + ", ".join(parts))


if __name__ == "__main__":
    main()
