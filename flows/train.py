"""``python -m flows.train [+task=NAME] [key=value ...]``: the training flow.

Composes ``conf/train.yaml``, opens one MLflow run, starts the pool, the policy backend and the
gateway, runs client workers as Prefect tasks and loops: wait for the batching strategy ->
lease -> merge + update -> publish -> checkpoint -> ack -> log. Stops after ``train.updates``
updates or on Ctrl-C, leaving the pool (unacked leases expire back) and the MLflow run consistent.
Every stage is a Prefect task wrapping a plain ``swarm`` function.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf
from prefect import flow, task
from prefect.cache_policies import NONE
from prefect.task_runners import ThreadPoolTaskRunner

from flows import console, tracking
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
from swarm.errors import LeaseError
from swarm.pool import Lease, Pool
from swarm.stack import start_stack
from swarm.train import Trainer, distributed, items_from_steps
from swarm.train.base_model import policy_models

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
def publish_task(trainer: Trainer, pool: Pool) -> dict[str, float]:
    record, metrics = trainer.publish()
    pool.add_policy_version(record)
    return metrics


@task(name="ack", cache_policy=NONE, retries=2, retry_delay_seconds=1)
def ack_task(pool: Pool, lease_id: str, version: int) -> int:
    return pool.ack(lease_id, version)


def run_update(pool: Pool, trainer: Trainer, cfg: dict[str, Any], stop: threading.Event,
               progress: Any = None, stack: Any = None) -> tuple[dict[str, float], list] | None:
    """One committed update of one policy; returns its metrics and the trained steps (None: stopped)."""
    t0 = time.perf_counter()
    flt = loop.trainable_filter(trainer.policy, trainer.version, cfg["train"]["max_staleness"],
                                nonzero_variance=cfg["batching"]["strategy"] == "groups_var")
    while True:  # an empty lease (the groups went to another trainer first) means: wait again
        decision = wait_task(pool, flt, cfg["batching"], int(cfg["task"]["group_size"]),
                             float(cfg["train"]["batch_timeout_s"]), progress, stop,
                             stack.sync_clients if stack is not None else None)
        if not decision.fire:
            return None
        if stack is not None and cfg["batching"]["strategy"] in ("any_agree", "all_agree"):
            stack.take_agreements()
        lease = lease_task(pool, flt, decision, float(cfg["train"]["lease_ttl_s"]))
        if lease.steps:
            break
    t_wait = time.perf_counter() - t0
    metrics = loop.batch_metrics(lease.steps, trainer.version)
    metrics.update(update_task(trainer, lease.steps, cfg["algo"]))
    metrics.update(publish_task(trainer, pool))
    trainer.save_checkpoint(extra={"lease_id": lease.lease_id})  # the update is committed here
    ack_task(pool, lease.lease_id, trainer.version)
    wall = time.perf_counter() - t0
    metrics.update({"time/wait_s": t_wait, "time/update_wall_s": wall,
                    "throughput/steps_per_s": len(lease.steps) / max(wall, 1e-9)})
    return metrics, lease.steps


def _resume(trainer: Trainer, pool: Pool, backend: Any) -> None:
    """Continue from the last committed update: restore weights, re-publish, ack its lease."""
    extra = trainer.resume()
    if extra is None:
        return
    backend.load_weights(trainer.policy, trainer.adapter_state(), trainer.version)
    try:
        pool.ack(extra["lease_id"], trainer.version)
    except LeaseError:
        pass  # already acked before the restart


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
    trainers = {p: Trainer(models[p], tc, policy=p, backend=backend, out_dir=out) for p in policies}
    if cfg["train"].get("resume", True):
        for tr in trainers.values():
            _resume(tr, pool, backend)
    stack = start_stack(pool, backend, gateway_settings(cfg["gateway"]), host=cfg["gateway"]["host"],
                        port=int(cfg["gateway"]["port"]))
    stop = threading.Event()
    procs: list[subprocess.Popen] = []
    runner = cfg["runner"]
    task_name = cfg["task"]["name"]
    run_name = cfg.get("run_name") or f"{task_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    history: list[dict[str, float]] = []
    agree_every = int(cfg["batching"].get("agree_every", 0))
    mcfg = cfg["mlflow"]  # nested / parent_run_id: set by flows.campaign for sweep members
    with tracking.open_run(mcfg["tracking_uri"], mcfg["experiment"], run_name, cfg, nested=bool(mcfg.get("nested")),
                           parent_run_id=mcfg.get("parent_run_id")) as run:
        futures = start_workers(runner, stack.url, cfg["task"], int(cfg["seed"]), agree_every, stop, procs)
        status = "FINISHED"
        t_eval = time.time()
        try:
            with console.TrainProgress(int(cfg["train"]["updates"]), pool) as progress:
                while len(history) < int(cfg["train"]["updates"]) and not stop.is_set():
                    row: dict[str, float] = {}
                    for policy, tr in trainers.items():
                        done = run_update(pool, tr, cfg, stop, progress.on_poll, stack)
                        if done is None:
                            break
                        m, steps = done
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
            if status != "FAILED":  # torchrun: release the followers (on a failure torchrun ends them)
                distributed.broadcast_batch(None)
            stop.set()
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for f in futures:
                f.wait(30)
            stack.stop()
            for tr in trainers.values():
                tracking.log_dir(out / "adapters" / tr.policy, f"adapters/{tr.policy}")
            merge_rows = [{k: v for k, v in row.items() if k.startswith("merge/")} for row in history]
            tracking.mlflow.log_dict({"per_update": merge_rows}, "merge_stats.json")
            tracking.mlflow.end_run(status)
            pool.close()
        summary = console.summary(history, run.info.run_id, status)
    return summary


# -- torchrun data parallel (docs/scale_out.md "Training on GPUs"): ranks > 0 run this, not the flow --
def follow_flow(cfg: dict[str, Any]) -> int:
    """Ranks > 0: rank 0's trainers (same order, same TrainConfig), trained on the batches it broadcasts."""
    tc = distributed.broadcast_object(None)  # train_flow's TrainConfig (pad id from rank 0's backend)
    device = distributed.local_device(str(cfg["train"].get("device", "cpu")))
    path = trainer_model_path(cfg["model"])
    models = _trainer_models(cfg, path, tc, list(cfg["policies"]), device)
    trainers = {p: Trainer(models[p], tc, policy=p, out_dir=cfg["train"]["out_dir"]) for p in cfg["policies"]}
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
    train_flow(resolved)


if __name__ == "__main__":
    main()
