"""``python -m flows.train [+task=NAME] [key=value ...]``: the training flow.

Composes ``conf/train.yaml``, opens one MLflow run, starts the pool, the policy backend and the
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

import hydra
from omegaconf import DictConfig, OmegaConf
from prefect import flow, task
from prefect.cache_policies import NONE
from prefect.task_runners import ThreadPoolTaskRunner

from flows import console, shutdown, tracking
from flows.components import (
    gateway_settings,
    lora_spec,
    make_backend,
    make_pool,
    make_train_config,
    trainer_model_path,
)
from flows.workers import start_workers
from swarm import loop
from swarm.pool import Lease, Pool
from swarm.stack import start_stack
from swarm.train import Ledger, Trainer, distributed, items_from_steps
from swarm.train import quarantine as quarantine_mod
from swarm.train.base_model import policy_models
from swarm.train.faults import crash_point

__all__ = ["train_flow", "run_update", "follow_flow", "main"]


@task(name="wait-for-batch", cache_policy=NONE)
def wait_task(pool: Pool, flt: Any, batching: dict[str, Any], group_size: int, timeout_s: float,
              on_poll: Any, stop: threading.Event, clients: Any = None) -> Any:
    return loop.wait_for_batch(pool, flt, batching["strategy"], min_episodes=int(batching["min_episodes"]),
                               min_groups=int(batching["min_groups"]), group_size=group_size, timeout_s=timeout_s,
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


def run_update(pool: Pool, trainer: Trainer, cfg: dict[str, Any], stop: threading.Event,
               progress: Any = None, stack: Any = None, ledger: Ledger | None = None,
               run_id: str | None = None) -> tuple[dict[str, float], list] | None:
    """One update of one policy; returns its metrics and the trained steps (None: stopped).

    With a ``ledger`` the update is committed at the next checkpoint (every k updates, or now
    when stopping); without one it is checkpointed and settled at once.
    """
    t0 = time.perf_counter()
    flt = loop.trainable_filter(trainer.policy, trainer.version, cfg["train"]["max_staleness"],
                                nonzero_variance=cfg["batching"]["strategy"] == "groups_var")
    ledger = ledger or Ledger(trainer, pool, every=1, ttl_s=float(cfg["train"]["lease_ttl_s"]))
    while True:  # an empty lease (the groups went to another trainer first) means: wait again
        decision = wait_task(pool, flt, cfg["batching"], int(cfg["task"]["group_size"]),
                             float(cfg["train"]["batch_timeout_s"]), progress, stop,
                             stack.sync_clients if stack is not None else None)
        if not decision.fire:
            return None
        if stack is not None and cfg["batching"]["strategy"] in ("any_agree", "all_agree"):
            stack.take_agreements()
        lease, steps, n_bad = _lease_usable(pool, trainer, flt, decision, float(cfg["train"]["lease_ttl_s"]),
                                            ledger)
        if steps:
            break
    t_wait = time.perf_counter() - t0
    metrics = loop.batch_metrics(steps, trainer.version)
    metrics["pool/quarantined"] = float(n_bad)
    metrics.update(update_task(trainer, steps, cfg["algo"]))
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
def train_flow(cfg: dict[str, Any]) -> dict[str, Any]:
    """The whole training run for a resolved config dict (see the module docstring)."""
    out = Path(cfg["train"]["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    policies = list(cfg["policies"])
    pool = make_pool(cfg["pool"])
    backend = make_backend(cfg["model"], policies, lora_spec(cfg["algo"]))
    path = trainer_model_path(cfg["model"])
    tc = make_train_config(cfg["algo"], float(cfg["task"]["temperature"]),
                           pad_id=int(getattr(getattr(backend, "tokenizer", None), "pad_token_id", 0) or 0))
    tc = distributed.broadcast_object(tc)  # torchrun: follow_flow receives it
    device = distributed.local_device(str(cfg["train"].get("device", "cpu")))
    models = _trainer_models(cfg, path, tc, policies, device)
    trainers = {p: Trainer(models[p], tc, policy=p, backend=backend, out_dir=out, tokenizer=path) for p in policies}
    ttl = float(cfg["train"]["lease_ttl_s"])
    ledgers = {p: Ledger(tr, pool, every=int(cfg["train"].get("checkpoint_every", 10)), ttl_s=ttl)
               for p, tr in trainers.items()}
    resume = bool(cfg["train"].get("resume", True))
    for led in ledgers.values():
        led.resume(load=resume)
    done = min(tr.updates for tr in trainers.values())
    total = int(cfg["train"]["updates"])
    if done:
        print(f"resuming from update {done} (policy version {max(t.version for t in trainers.values())}); "
              f"train.updates={total} is the total", flush=True)
    stack = start_stack(pool, backend, gateway_settings(cfg["gateway"]), host=cfg["gateway"]["host"],
                        port=int(cfg["gateway"]["port"]))
    stop = shutdown.STOP.install()  # Prefect swapped in its own SIGTERM handler for the flow run
    procs: list[subprocess.Popen] = []
    runner = cfg["runner"]
    task_name = cfg["task"]["name"]
    run_name = cfg.get("run_name") or f"{task_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    history: list[dict[str, float]] = []
    agree_every = int(cfg["batching"].get("agree_every", 0))
    mcfg = cfg["mlflow"]  # nested / parent_run_id: set by flows.campaign for sweep members
    previous = _previous_run(out) if resume else None
    with tracking.open_run(mcfg["tracking_uri"], mcfg["experiment"], run_name, cfg, nested=bool(mcfg.get("nested")),
                           parent_run_id=mcfg.get("parent_run_id"), continue_run_id=previous) as run:
        (out / "mlflow_run.json").write_text(json.dumps({"run_id": run.info.run_id}))
        futures = start_workers(runner, stack.url, cfg["task"], int(cfg["seed"]), agree_every, stop, procs)
        status = "FINISHED"
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
                        _log_samples(steps, backend, policy, tr.version, int(cfg["mlflow"]["sample_trajectories"]))
                    if not row:
                        break
                    ev = loop.eval_reward(pool, t_eval)
                    if ev is not None:
                        row["eval/reward"] = ev
                    t_eval = time.time()
                    version = max(tr.version for tr in trainers.values())
                    tracking.log_metrics(row, step=version)
                    history.append(row)
                    progress.advance(row)
        except KeyboardInterrupt:
            status = "KILLED"
        except BaseException:
            status = "FAILED"
            raise
        finally:
            if shutdown.STOP.signum is not None and status == "FINISHED":
                status = "KILLED"
            if status != "FAILED":  # a clean stop: published version = last checkpoint = last MLflow step
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
            tracking.mlflow.end_run(status)
            pool.close()
            shutdown.STOP.restore()
        summary = console.summary(history, run.info.run_id, status)
    return summary


# -- torchrun data parallel (docs/scale_out.md "Training on GPUs"): ranks > 0 run this, not the flow --
def follow_flow(cfg: dict[str, Any]) -> int:
    """Ranks > 0: rank 0's trainers (same order, same TrainConfig), trained on the batches it broadcasts."""
    tc = distributed.broadcast_object(None)  # train_flow's TrainConfig (pad id from rank 0's backend)
    device = distributed.local_device(str(cfg["train"].get("device", "cpu")))
    path = trainer_model_path(cfg["model"])
    models = _trainer_models(cfg, path, tc, list(cfg["policies"]), device)
    trainers = {p: Trainer(models[p], tc, policy=p, out_dir=cfg["train"]["out_dir"],
                        tokenizer=path) for p in cfg["policies"]}
    if cfg["train"].get("resume", True):
        for tr in trainers.values():
            tr.resume()  # the checkpoint rank 0 resumes from (shared out_dir)
    return distributed.follow(trainers)


def _trainer_models(cfg: dict[str, Any], path: str, tc: Any, policies: list[str], device: Any) -> dict[str, Any]:
    """One shared frozen base (``model.dtype``) with a LoRA adapter per policy; full fine-tuning: one copy each."""
    return policy_models(path, tc.lora, policies, dtype=str(cfg["model"].get("dtype") or "float32"), device=device,
                         gradient_checkpointing=bool(cfg["train"].get("gradient_checkpointing", False)))


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


@hydra.main(version_base=None, config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    shutdown.STOP.install()  # Ctrl-C / SIGTERM: finish the update, checkpoint, exit 130 / 143
    # the progress bar and summary table are the console view; per-task-run lines are noise
    logging.getLogger("prefect.task_runs").setLevel(logging.WARNING)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    # -- torchrun (WORLD_SIZE > 1): rank 0 runs the flow, ranks > 0 follow it (docs/scale_out.md) --
    if distributed.init_from_env(str(resolved["train"].get("device", "cpu"))):
        resolved = distributed.broadcast_object(resolved)  # rank 0's out_dir: hydra's differs per process
        try:
            if distributed.is_main():
                train_flow(resolved)
            else:
                n = follow_flow(resolved)
                print(f"rank {distributed.rank()}: followed {n} updates", flush=True)
        finally:
            distributed.shutdown()
        return
    with shutdown.own_prefect_server():
        train_flow(resolved)
    if shutdown.STOP.exit_code is not None:
        sys.exit(shutdown.STOP.exit_code)


if __name__ == "__main__":
    main()
