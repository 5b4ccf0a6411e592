"""The training flow behind ``python -m flows.train`` (:mod:`flows.train` is the command line).

For a validated :class:`flows.config.RunConfig`: opens one MLflow run, starts the pool, the policy backend and the
gateway, runs client workers as Prefect tasks and loops: wait for the batching strategy ->
lease -> quarantine unusable steps -> merge + update -> publish -> log, and every
``train.checkpoint_every`` updates: checkpoint -> settle the leases it contains
(:class:`swarm.train.Ledger`, docs/reliability.md). ``train.updates`` is a total: a resumed run
continues from its last checkpoint ("resuming from update k") and the same MLflow run.
Ctrl-C / SIGTERM finish the current update, checkpoint, end the MLflow run KILLED and exit
130 / 143 (:mod:`flows.shutdown`). Every stage is a Prefect task wrapping a plain ``swarm`` function.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NONE
from prefect.task_runners import ThreadPoolTaskRunner

from flows import console, shutdown, tracking
from flows.components import (
    gateway_settings,
    make_gateway_backend,
    make_pool,
    model_dtype,
    trainer_model_path,
)
from flows.config import BatchingSection, RunConfig, check_task, make_train_config, validate
from flows.workers import start_workers
from swarm import loop
from swarm.pool import Lease, Pool
from swarm.stack import start_stack
from swarm.train import Ledger, Trainer, distributed, items_from_steps
from swarm.train import quarantine as quarantine_mod
from swarm.train.base_model import policy_models
from swarm.train.faults import crash_point

__all__ = ["train_flow", "run_update", "follow_flow", "run_main"]


@task(name="wait-for-batch", cache_policy=NONE)
def wait_task(pool: Pool, flt: Any, batching: BatchingSection, group_size: int, timeout_s: float,
              on_poll: Any, stop: threading.Event, clients: Any = None) -> Any:
    return loop.wait_for_batch(pool, flt, batching.strategy, min_episodes=batching.min_episodes,
                               min_groups=batching.min_groups, group_size=group_size, timeout_s=timeout_s,
                               clients=clients, on_poll=on_poll, should_stop=stop.is_set)


@task(name="lease", cache_policy=NONE, retries=2, retry_delay_seconds=1)
def lease_task(pool: Pool, flt: Any, decision: Any, ttl_s: float) -> Lease:
    return loop.lease_batch(pool, flt, decision, ttl_s)


@task(name="update", cache_policy=NONE)
def update_task(trainer: Trainer, steps: list, algo: dict[str, Any]) -> dict[str, float]:
    items = items_from_steps(steps, group_by=algo.get("group_by", "group"), scale_std=bool(algo.get("scale_std", True)))
    distributed.broadcast_batch(items, trainer.policy, trainer.version)  # torchrun: ranks > 0 train it too
    return trainer.update(items)


@task(name="publish", cache_policy=NONE)
def publish_task(trainer: Trainer, pool: Pool, save: bool = True) -> dict[str, float]:
    record, metrics = trainer.publish(save=save)
    pool.add_policy_version(record)
    return metrics


@task(name="checkpoint", cache_policy=NONE)
def checkpoint_task(ledger: Ledger, run_id: str | None) -> Any:
    """Commit a checkpoint with the pending leases, then settle them; log its adapter to MLflow."""
    done = ledger.commit({"mlflow_run_id": run_id})
    if done is not None and done[1] is not None and run_id is not None:
        tracking.log_dir(done[1], f"adapters/{ledger.trainer.policy}/{done[1].name}")
    return done


def _lease_usable(pool: Pool, trainer: Trainer, flt: Any, decision: Any, ttl_s: float,
                  ledger: Ledger | None) -> tuple[Lease, list, int]:
    """Lease a batch and quarantine what the model cannot take: (lease, usable steps, quarantined)."""
    if ledger is not None:
        ledger.renew()  # our own lease must never take back steps we trained but did not settle yet
    lease = lease_task(pool, flt, decision, ttl_s)
    steps, bad = quarantine_mod.usable(lease.steps, *quarantine_mod.limits_of(trainer.model))
    if bad:
        quarantine_mod.quarantine(pool, bad)
        if not steps:
            pool.settle(lease.lease_id, [], trainer.version)  # close it; the labels keep them out
    return lease, steps, len(bad)


def run_update(pool: Pool, trainer: Trainer, cfg: RunConfig, stop: threading.Event,
               progress: Any = None, stack: Any = None, ledger: Ledger | None = None,
               run_id: str | None = None) -> tuple[dict[str, float], list] | None:
    """One update of one policy; returns its metrics and the trained steps (None: stopped).

    With a ``ledger`` the update is committed at the next checkpoint (every k updates, or now
    when stopping); without one it is checkpointed and settled at once.
    """
    t0 = time.perf_counter()
    flt = loop.trainable_filter(trainer.policy, trainer.version, cfg.train.max_staleness,
                                nonzero_variance=cfg.batching.strategy == "groups_var")
    ledger = ledger or Ledger(trainer, pool, every=1, ttl_s=cfg.train.lease_ttl_s)
    while True:  # an empty lease (the groups went to another trainer first) means: wait again
        decision = wait_task(pool, flt, cfg.batching, cfg.task.group_size, cfg.train.batch_timeout_s, progress, stop,
                             stack.sync_clients if stack is not None else None)
        if not decision.fire:
            return None
        if stack is not None and cfg.batching.strategy in ("any_agree", "all_agree"):
            stack.take_agreements()
        lease, steps, n_bad = _lease_usable(pool, trainer, flt, decision, cfg.train.lease_ttl_s, ledger)
        if steps:
            break
    t_wait = time.perf_counter() - t0
    metrics = loop.batch_metrics(steps, trainer.version)
    metrics["pool/quarantined"] = float(n_bad)
    metrics.update(update_task(trainer, steps, cfg.algo))
    crash_point("after_update")
    commit = ledger.due() or stop.is_set()  # this update ends at a checkpoint: keep its adapter
    metrics.update(publish_task(trainer, pool, commit))
    ledger.trained(lease.lease_id, [s.step_id for s in steps])
    crash_point("after_publish")
    if commit:
        checkpoint_task(ledger, run_id)
    wall = time.perf_counter() - t0
    metrics.update({"time/wait_s": t_wait, "time/update_wall_s": wall,
                    "throughput/steps_per_s": len(steps) / max(wall, 1e-9)})
    return metrics, steps


def _previous_run(out: Path) -> str | None:
    """The MLflow run id an earlier attempt of this run directory logged to (None: first attempt)."""
    f = out / "mlflow_run.json"
    return json.loads(f.read_text()).get("run_id") if f.exists() else None


@flow(name="swarm-train", task_runner=ThreadPoolTaskRunner(max_workers=64), validate_parameters=False,
      log_prints=False)
def train_flow(cfg: RunConfig | dict[str, Any]) -> dict[str, Any]:
    """The whole training run (see the module docstring); a plain dict is validated first."""
    cfg = cfg if isinstance(cfg, RunConfig) else validate(cfg)
    check_task(cfg.task, cfg.runner)  # before anything starts: a bad task option would fail every episode
    out = Path(cfg.train.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pool = make_pool(cfg.pool)
    backend = make_gateway_backend(cfg)  # the trained policies' backend, routed beside frozen ones
    path = trainer_model_path(cfg.model)
    tc = make_train_config(cfg.algo, cfg.task.temperature,
                           pad_id=int(getattr(getattr(backend, "tokenizer", None), "pad_token_id", 0) or 0))
    tc = distributed.broadcast_object(tc)  # torchrun: follow_flow receives it
    device = distributed.local_device(cfg.train.device)
    models = _trainer_models(cfg, path, tc, device)
    trainers = {p: Trainer(models[p], tc, policy=p, backend=backend, out_dir=out, tokenizer=path) for p in cfg.policies}
    ledgers = {p: Ledger(tr, pool, every=cfg.train.checkpoint_every, ttl_s=cfg.train.lease_ttl_s)
               for p, tr in trainers.items()}
    for led in ledgers.values():
        led.resume(load=cfg.train.resume)
    done = min(tr.updates for tr in trainers.values())
    total = cfg.train.updates
    stack = start_stack(pool, backend, gateway_settings(cfg.gateway), host=cfg.gateway.get("host", "127.0.0.1"),
                        port=int(cfg.gateway.get("port", 0)))
    stop = shutdown.STOP.install()  # Prefect swapped in its own SIGTERM handler for the flow run
    procs: list[subprocess.Popen] = []
    history: list[dict[str, float]] = []
    previous = _previous_run(out) if cfg.train.resume else None
    t_start = time.time()
    with tracking.open_run(cfg, continue_run_id=previous) as run:
        (out / "mlflow_run.json").write_text(json.dumps({"run_id": run.info.run_id}))
        console.where(gateway=stack.url, run_dir=out, mlflow_uri=tracking.tracking_uri(cfg.mlflow.tracking_uri),
                      experiment=cfg.mlflow.experiment, run_name=run.info.run_name, run_id=run.info.run_id,
                      model=path)
        if done:
            console.say(f"resuming from update {done} (policy version {max(t.version for t in trainers.values())}); "
                        f"train.updates={total} is the total")
        futures = start_workers(cfg.runner, stack.url, cfg.task.model_dump(), cfg.seed, cfg.batching.agree_every,
                                stop, procs)
        status, reason = "FINISHED", ""
        t_eval = time.time()
        try:
            with console.TrainProgress(max(total - done, 0), pool) as progress:
                while min(tr.updates for tr in trainers.values()) < total and not stop.is_set():
                    row: dict[str, float] = {}
                    for policy, tr in trainers.items():
                        result = run_update(pool, tr, cfg, stop, progress.on_poll, stack, ledgers[policy],
                                            run.info.run_id)
                        if result is None:
                            break
                        m, steps = result
                        row.update({k if len(trainers) == 1 else f"{k}/{policy}": v for k, v in m.items()})
                        _log_samples(steps, backend, policy, tr.version, cfg.mlflow.sample_trajectories)
                    if not row:
                        break
                    row.update(loop.episode_metrics(pool, t_eval, policies=cfg.policies))  # what the task reported: win rate, accuracy, ...
                    t_eval = time.time()
                    version = max(tr.version for tr in trainers.values())
                    tracking.log_metrics(row, step=version)
                    history.append(row)
                    progress.advance(row)
        except TimeoutError as exc:  # no batch within train.batch_timeout_s: a clear failure, not a traceback
            status = "FAILED"
            reason = (f"{exc} after update {min(tr.updates for tr in trainers.values())} of {total} "
                      f"(train.batch_timeout_s={cfg.train.batch_timeout_s:g}): are the workers failing? "
                      f"The dashboard shows their episodes")
        except KeyboardInterrupt:
            status = "KILLED"
        except BaseException:
            status = "FAILED"
            raise
        finally:
            if shutdown.STOP.signum is not None and status == "FINISHED":
                status = "KILLED"
            if status != "FAILED" or reason:  # a clean stop: published version = last checkpoint = last MLflow step
                for led in ledgers.values():
                    checkpoint_task(led, run.info.run_id)
                distributed.broadcast_batch(None)  # torchrun: release the followers (on a failure torchrun ends them)
            stop.set()
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for f in futures:
                f.wait(30)
            stack.stop()
            merge_rows = [{k: v for k, v in row.items() if k.startswith("merge/")} for row in history]
            tracking.mlflow.log_dict({"per_update": merge_rows}, "merge_stats.json")
            summary = console.summary_values(history, time.time() - t_start)
            tracking.log_summary(summary)
            tracking.log_metrics(loop.eval_summary(pool, t_start, policies=cfg.policies), step=max(t.version for t in trainers.values()))
            if reason:
                tracking.mlflow.set_tag("swarm.failure", reason)
            tracking.mlflow.end_run(status)
            pool.close()
            shutdown.STOP.restore()
        if reason:
            console.say(f"[red]run FAILED[/red]: {reason}")
        out_summary = console.summary(history, run.info.run_id, status, summary)
    return out_summary


# -- torchrun data parallel (docs/scale_out.md "Training on GPUs"): ranks > 0 run this, not the flow --
def follow_flow(cfg: RunConfig) -> int:
    """Ranks > 0: rank 0's trainers (same order, same TrainConfig), trained on the batches it broadcasts."""
    tc = distributed.broadcast_object(None)  # train_flow's TrainConfig (pad id from rank 0's backend)
    device = distributed.local_device(cfg.train.device)
    path = trainer_model_path(cfg.model)
    models = _trainer_models(cfg, path, tc, device)
    trainers = {p: Trainer(models[p], tc, policy=p, out_dir=cfg.train.out_dir, tokenizer=path) for p in cfg.policies}
    if cfg.train.resume:
        for tr in trainers.values():
            tr.resume()  # the checkpoint rank 0 resumes from (shared out_dir)
    return distributed.follow(trainers)


def _trainer_models(cfg: RunConfig, path: str, tc: Any, device: Any) -> dict[str, Any]:
    """One shared frozen base (``model.dtype``) with a LoRA adapter per policy; full fine-tuning: one copy each."""
    return policy_models(path, tc.lora, cfg.policies, dtype=model_dtype(cfg.model), device=device,
                         gradient_checkpointing=cfg.train.gradient_checkpointing)


def _log_samples(steps: list, backend: Any, policy: str, version: int, n: int) -> None:
    """The first ``n`` trained episodes of an update, rendered readably, as an MLflow artifact."""
    by_ep: dict[str, list] = {}
    for s in steps:
        by_ep.setdefault(s.episode_id, []).append(s)
    eps = list(by_ep.values())[:n]
    if not eps:
        return
    text = "\n\n".join(f"## episode {e[0].episode_id} ({e[0].task})\n\n"
                       + tracking.render_trajectory(sorted(e, key=lambda s: s.index),
                                                    lambda ids: backend.decode(policy, ids))
                       for e in eps)
    tracking.log_text(text, f"trajectories/{policy}/v{version:04d}.md")


def run_main(cfg: RunConfig) -> None:
    """Run a validated config: torchrun ranks (WORLD_SIZE > 1) or one process under its own Prefect server."""
    # the progress bar and summary table are the console view; per-task-run lines are noise
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    # -- torchrun: rank 0 runs the flow, ranks > 0 follow it (docs/scale_out.md) --
    if distributed.init_from_env(cfg.train.device):
        cfg = distributed.broadcast_object(cfg)  # rank 0's out_dir: hydra's differs per process
        try:
            if distributed.is_main():
                train_flow(cfg)
            else:
                n = follow_flow(cfg)
                print(f"rank {distributed.rank()}: followed {n} updates", flush=True)
        finally:
            distributed.shutdown()
        return
    with shutdown.own_prefect_server():
        summary = train_flow(cfg)
    if summary["status"] == "FAILED":
        sys.exit(1)
