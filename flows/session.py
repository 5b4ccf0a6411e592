"""The training run's session: :func:`open_session` starts, on one :class:`contextlib.ExitStack`, the
Ctrl-C / SIGTERM handlers (:mod:`flows.shutdown`), the pool, the policy backend, the trainers and ledgers
(resumed) after claiming its policies in the pool (:mod:`swarm.pool.claims`: a second run training one of
them on the same pool fails to start, naming the holder; the claim heartbeats until the session ends), the
gateway with the run's control (:mod:`swarm.control`), then, with ``train.wait_for_client``,
waits for a client's ``POST /v1/control/start`` (its overrides become the run's config; a stop or Ctrl-C
while waiting ends everything, no MLflow run), the MLflow run and the workers; leaving it (success, Ctrl-C, SIGTERM, no batch
in time, any error) undoes them in reverse, a clean stop first checkpointing every trainer (published
version = checkpoint = MLflow step). A stage failing to start raises :class:`StartError` naming it
("starting the gateway failed: ..."). It neither trains (:mod:`swarm.update`) nor builds components.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from rich.markup import escape

from flows import console, shutdown, tracking
from flows import control as flow_control
from flows.components import make_gateway_backend, make_pool, model_dtype, start_gateway, trainer_model_path
from flows.config import RunConfig, make_train_config
from flows.workers import WorkerHandle, start_workers
from swarm import loop
from swarm.client import WorkerConfig
from swarm.control import Control
from swarm.errors import BackendError, SwarmError
from swarm.policy import PolicyBackend
from swarm.pool import Claims, LeaseBook, Pool, Reader, StepFilter, parse_ref
from swarm.pool.claims import holder_id
from swarm.train import Ledger, TrainConfig, Trainer, distributed
from swarm.train.base_model import policy_models

if TYPE_CHECKING:
    from mlflow import ActiveRun

    from swarm.policy.vllm_server import VLLMServer
    from swarm.stack import Stack

__all__ = ["StartError", "Session", "Checkpoint", "open_session", "make_trainers", "resolve_curation"]

_T = TypeVar("_T")
Checkpoint = Callable[[Ledger, dict[str, str | None]], object]  # commits a ledger at a clean stop (flows.run)


class StartError(SwarmError, RuntimeError):
    """A session stage failed to start; the message names the stage, the cause is chained."""


@dataclass
class Session:
    """What a started run holds, and how it ended (``status``, ``reason``) once the session closes."""

    cfg: RunConfig
    stop: threading.Event
    pool: Pool | None = None  # each None until its stage started (see open_session)
    backend: PolicyBackend | None = None
    stack: Stack | None = None
    run: ActiveRun | None = None  # also None after a stop while waiting for a client (train.wait_for_client)
    ledgers: dict[str, Ledger] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)
    status: str = "FAILED"  # until every stage started
    reason: str = ""
    crashed: bool = False  # stopped like a crash (no closing checkpoint), with ``reason`` said
    values: dict[str, float] = field(default_factory=dict)
    t_start: float = field(default_factory=time.time)
    curation: tuple[str | None, StepFilter | None] = (None, None)  # (name@version, filter): what the lease takes
    control: Control[RunConfig] | None = None  # the run's control state (/v1/control on its gateway)
    workers: list[WorkerConfig] = field(default_factory=list)  # the thread and process workers' (eval_every)
    control_lines: list[str] = field(default_factory=list)  # control_events.jsonl

    def updates(self) -> int:
        """Updates every trainer has done (the run's progress)."""
        return min((led.trainer.updates for led in self.ledgers.values()), default=0)  # 0 before the trainers start

    def version(self) -> int:
        """The newest published policy version: the MLflow step."""
        return max(led.trainer.version for led in self.ledgers.values())

    def record(self, row: dict[str, float]) -> None:
        """Log one update's row to MLflow at the current version (queued: MLflow's logging thread writes it
        while the next update runs; :func:`_end_run` flushes) and keep it for the summary."""
        tracking.log_metrics(row, step=self.version(), wait=False)
        self.history.append(row)


def _start(stage: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)``; a failure becomes a :class:`StartError` naming ``stage``."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # any stage's failure, whatever its kind: named and chained, not swallowed
        raise StartError(f"starting {stage} failed: {exc}") from exc


def make_trainers(cfg: RunConfig, tc: TrainConfig, backend: PolicyBackend | None = None) -> dict[str, Trainer]:
    """One Trainer per policy: a shared frozen base (``model.dtype``) with a LoRA adapter each (full FT: a copy each)."""
    path = trainer_model_path(cfg.model)
    models = policy_models(path, tc.lora, cfg.policies, dtype=model_dtype(cfg.model),
                           device=distributed.local_device(cfg.train.device),
                           gradient_checkpointing=cfg.train.gradient_checkpointing)
    return {p: Trainer(models[p], tc, policy=p, backend=backend, out_dir=cfg.train.out_dir, tokenizer=path)
            for p in cfg.policies}


def resolve_curation(cfg: RunConfig, pool: Reader) -> tuple[str | None, StepFilter | None]:
    """(``name@version`` or None, the filter) of the run's curated set: ``train.curation`` read from the
    pool, else the inline ``train.filter``, else (None, None); a field contradicting training is named."""
    if cfg.train.curation is not None:
        c = pool.curation(*parse_ref(cfg.train.curation))
        ref, flt = c.ref, c.filter
    else:
        ref, flt = None, cfg.train.step_filter()
    if flt is not None:
        for policy in cfg.policies:
            loop.trainable_filter(policy, 0, cfg.train.max_staleness, curated=flt)
    return ref, flt


def _ledgers(cfg: RunConfig, pool: LeaseBook, backend: PolicyBackend) -> dict[str, Ledger]:
    """The trainers (their TrainConfig sent to torchrun followers) and ledgers, resumed from the last checkpoint."""
    pad = int(getattr(getattr(backend, "tokenizer", None), "pad_token_id", 0) or 0)
    tc = distributed.broadcast_object(make_train_config(cfg.algo, cfg.task.temperature, pad_id=pad))
    ledgers = {p: Ledger(tr, pool, every=cfg.train.checkpoint_every, ttl_s=cfg.train.lease_ttl_s)
               for p, tr in make_trainers(cfg, tc, backend).items()}
    for led in ledgers.values():
        led.resume(load=cfg.train.resume)
    return ledgers


def _open_run(s: Session, out: Path) -> ActiveRun:
    """Open (or, resuming, continue) the MLflow run and say where everything is."""
    f = out / "mlflow_run.json"
    previous = json.loads(f.read_text()).get("run_id") if s.cfg.train.resume and f.exists() else None
    run = tracking.open_run(s.cfg, continue_run_id=previous)
    tracking.log_curation(*s.curation)
    if s.curation[1] is not None:
        shown = s.curation[1].model_dump(exclude_defaults=True)
        console.say(f"training on the curated set {s.curation[0] or 'train.filter'}: {shown}")
    f.write_text(json.dumps({"run_id": run.info.run_id}))
    for led in s.ledgers.values():  # each published version names the run that trained it (lineage, flows.eval)
        led.version_metadata["mlflow_run_id"] = run.info.run_id
    console.where(gateway=s.stack.url, run_dir=out, mlflow_uri=tracking.tracking_uri(s.cfg.mlflow.tracking_uri),
                  experiment=s.cfg.mlflow.experiment, run_name=run.info.run_name, run_id=run.info.run_id,
                  model=trainer_model_path(s.cfg.model))
    if s.updates():
        console.say(f"resuming from update {s.updates()} (policy version {s.version()}); "
                    f"train.updates={s.cfg.train.updates} is the total")
    return run


def _end_run(s: Session) -> None:
    """Log the merge stats, the summary and the eval games, then end the MLflow run with the session's status
    (the queued update rows written first: a stopped run's MLflow ends at its checkpoint's version)."""
    tracking.flush()
    tracking.mlflow.log_dict({"per_update": [{k: v for k, v in row.items() if k.startswith("merge/")}
                                             for row in s.history]}, "merge_stats.json")
    s.values = console.summary_values(s.history, time.time() - s.t_start)
    tracking.log_summary(s.values)
    tracking.log_metrics(loop.eval_summary(s.pool, s.t_start, policies=s.cfg.policies), step=s.version())
    if s.reason:
        tracking.mlflow.set_tag("swarm.failure", s.reason)
        console.say(f"[red]run FAILED[/red]: {s.reason}")
    tracking.mlflow.end_run(s.status)


CLAIM_TTL_S = 30.0  # a run's policy claim lapses this long after its last heartbeat (every third of it)


def _claim(pool: Claims, policies: list[str], es: contextlib.ExitStack) -> str:
    """Claim ``policies`` for this run, heartbeat them on a daemon thread, release them when ``es`` closes."""
    holder = holder_id()
    done = threading.Event()
    claimed: list[str] = []

    def release() -> None:
        done.set()
        for p in claimed:
            pool.release_claim(p, holder)

    es.callback(release)
    for p in policies:
        pool.claim_policy(p, holder, ttl_s=CLAIM_TTL_S)
        claimed.append(p)

    def beat() -> None:
        while not done.wait(CLAIM_TTL_S / 3):
            for p in claimed:
                try:
                    if not pool.heartbeat_claim(p, holder):
                        console.say(f"[red]the claim on policy {p!r} lapsed and another run took it[/red]")
                except Exception as exc:  # a busy database once must not end the heartbeat
                    console.say(f"claim heartbeat failed (retrying): {exc}")

    threading.Thread(target=beat, name="policy-claims", daemon=True).start()
    return holder


def _await_client(s: Session) -> bool:
    """``train.wait_for_client``: wait for ``POST /v1/control/start``; take its config. False: stopped first."""
    console.say(f"waiting for a client: POST {s.stack.url}/v1/control/start (python -m swarm.client.control "
                f"--server {s.stack.url} start k=v ...); Ctrl-C ends")
    started = s.control.wait_for_start(s.stop)
    if started is None:
        console.say("stopped while waiting for a client: nothing trained")
        return False
    s.cfg = started
    s.curation = _start(f"the curation {started.train.curation or '(train.filter)'}", resolve_curation, started, s.pool)
    flow_control.retrain_config(s.ledgers, started)
    return True


def _stop_workers(stop: threading.Event, futures: list[WorkerHandle], procs: list[subprocess.Popen]) -> None:
    stop.set()
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for f in futures:
        f.wait(30)


def _fail(s: Session) -> Callable[[str], None]:
    """What a stage that fails while the run goes on calls (a worker process that cannot start): the run stops with
    that reason, checkpointed, FAILED, instead of waiting out ``train.batch_timeout_s``."""
    def fail(reason: str) -> None:
        if not s.stop.is_set():
            console.say(f"[red]{escape(reason)}[/red]")
            s.reason = s.reason or reason
            s.stop.set()
    return fail


def _final_checkpoint(s: Session, checkpoint: Checkpoint) -> None:
    """A clean stop (not a crash): checkpoint every trainer and release the torchrun followers."""
    if shutdown.STOP.signum is not None and s.status == "FINISHED":
        s.status = "KILLED"
    if (s.status != "FAILED" or s.reason) and not s.crashed:
        for led in s.ledgers.values():
            checkpoint(led, {"mlflow_run_id": s.run.info.run_id})
        distributed.broadcast_batch(None)  # on a failure torchrun ends the followers


def _engines(backend: object) -> tuple[list[VLLMServer], int]:
    """The local engine servers the backend started (model.base_url: null), a fleet's replicas' included, and how
    many replicas are not such servers (remote ones, in-process ones): the run does not depend on the local ones
    alone while there are any."""
    replicas = [r.backend for r in getattr(backend, "replicas", [])] or [backend]
    servers = [b.server for b in replicas if getattr(b, "server", None) is not None]
    return servers, len(replicas) - len(servers)


@contextlib.contextmanager
def _watch_engines(s: Session, every_s: float = 2.0) -> Iterator[None]:
    """While the session runs, check the local engine servers: one that dies is reported (with its log's tail);
    when none is left and no other replica serves, the run stops with that reason (status FAILED after its
    checkpoint) instead of timing out; while a fleet has other replicas it routes around the dead one."""
    servers, others = _engines(s.backend)
    if not servers:
        yield
        return
    done = threading.Event()

    def down(server: VLLMServer, misses: dict[int, int], i: int) -> bool:
        """Its process exited, or /health failed 3 times in a row (an engine that died inside a live process)."""
        if not server.alive():
            return True
        try:
            ok = httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            ok = False
        misses[i] = 0 if ok else misses.get(i, 0) + 1
        return misses[i] >= 3

    def watch() -> None:
        dead: set[int] = set()
        misses: dict[int, int] = {}
        while not done.wait(every_s):
            for i, server in enumerate(servers):
                if i not in dead and down(server, misses, i):
                    dead.add(i)
                    code = server.proc.poll() if server.proc is not None else None
                    console.say(f"[red]the vLLM server at {server.url} died[/red] (exit {code}); its log "
                                f"{escape(str(server.log_path))}:\n{escape(server.log_tail(15))}")
            if len(dead) == len(servers) and not others and not s.stop.is_set():
                s.reason = (f"the vLLM server{'s' if len(servers) > 1 else ''} died (log: "
                            f"{', '.join(str(x.log_path) for x in servers)}); the run stopped at update {s.updates()}")
                s.stop.set()
                return

    thread = threading.Thread(target=watch, name="engine-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)


@contextlib.contextmanager
def open_session(cfg: RunConfig, checkpoint: Checkpoint) -> Iterator[Session]:
    """Start the run's stages in order (see the module docstring); ``checkpoint`` commits a ledger at a clean stop."""
    out = Path(cfg.train.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as es:
        s = Session(cfg, shutdown.STOP.install())  # Prefect swapped in its own SIGTERM handler for the flow run
        es.callback(shutdown.STOP.restore)
        s.pool = _start("the pool", make_pool, cfg.pool)
        es.callback(s.pool.close)
        s.curation = _start(f"the curation {cfg.train.curation or '(train.filter)'}", resolve_curation, cfg, s.pool)
        _start("the policy claim", _claim, s.pool, cfg.policies, es)
        s.backend = _start("the policy backend", make_gateway_backend, cfg)
        es.callback(getattr(s.backend, "close", lambda: None))
        es.enter_context(_watch_engines(s))
        s.ledgers = _start("the trainers", _ledgers, cfg, s.pool, s.backend)
        s.control = Control(flow_control.knobs_of(cfg), wait_for_client=cfg.train.wait_for_client,
                            check_start=flow_control.start_checker(cfg))
        s.control.bind(s.stop)
        es.callback(s.control.finish)
        s.stack = _start("the gateway", start_gateway, s.pool, s.backend, cfg.gateway, s.control,
                         cfg.task.reward.authority(cfg.task.name) if cfg.task.reward is not None else None)
        es.callback(s.stack.stop)
        if cfg.train.wait_for_client and not _await_client(s):
            s.status = "KILLED"
            yield s
            return
        cfg = s.cfg
        s.run = _start("the MLflow run", _open_run, s, out)
        es.callback(_end_run, s)
        futures: list[WorkerHandle] = []
        procs: list[subprocess.Popen] = []
        es.callback(_stop_workers, s.stop, futures, procs)
        futures += _start("the workers", start_workers, cfg.runner, s.stack.url, cfg.task, cfg.seed,
                          cfg.batching.agree_every, s.stop, procs, s.workers, cfg.pool.url, _fail(s))
        es.callback(_final_checkpoint, s, checkpoint)
        s.status = "FINISHED"
        try:
            yield s
            if s.reason:  # a stage failed while the run went on (an engine died): stopped, checkpointed, FAILED
                s.status = "FAILED"
        except TimeoutError as exc:  # no batch within train.batch_timeout_s: a clear failure, not a traceback
            s.status, s.reason = "FAILED", (
                f"{exc} after update {s.updates()} of {cfg.train.updates} (train.batch_timeout_s="
                f"{cfg.train.batch_timeout_s:g}): are the workers failing? The dashboard shows their episodes")
        except KeyboardInterrupt:
            s.status = "KILLED"
        except BackendError as exc:  # the policy backend failed for good (a dead engine): one line, not a traceback;
            # no checkpoint: the failure may have come mid-publish, so the run resumes from its last one, as after a crash
            s.status, s.crashed = "FAILED", True
            s.reason = s.reason or f"the policy backend failed after update {s.updates()}: {exc}"
        except BaseException:
            s.status = "FAILED"
            raise
