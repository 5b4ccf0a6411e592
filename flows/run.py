"""The training flow behind ``python -m flows.train`` (:mod:`flows.train` is the command line): open the
run's session (:mod:`flows.session`), loop :func:`swarm.update.run_update` over the policies and log,
close. ``train.updates`` is a total: a resumed run continues from its last checkpoint ("resuming from
update k") and the same MLflow run. Ctrl-C / SIGTERM finish the current update, checkpoint, end the
MLflow run KILLED and exit 130 / 143 (:mod:`flows.shutdown`). The update's stages are plain calls
(:data:`STAGES`): five Prefect task runs an update cost the tiny default 0.08-0.13 s of its ~0.7 s
(``benchmarks/update_bench.py``), and the stages' timings are already MLflow's ``time/*`` metrics; the
client workers are the flow's Prefect tasks.

Between updates the loop reads the run's control (:mod:`swarm.control`, ``/v1/control``): it holds while
paused (a pause also ends a wait for a batch), applies queued knob changes (:mod:`flows.control`), and ends
after a client's stop like after Ctrl-C (checkpoint; MLflow KILLED before ``train.updates``, else FINISHED).

After each update the run's health (:class:`swarm.train.health.RunHealth`) reads its row: the train-inference
mismatch (``mismatch/logprob_abs_mean``) and the version each backend replica serves
(``policy/served_version/<replica>``). It warns once (console, log, MLflow tag ``swarm.warning``) at half of
``algo.max_mismatch`` or a replica behind, and stops the run (checkpoint; MLflow FAILED with the reason as
``swarm.failure``; exit 1) past ``algo.max_mismatch`` or a replica still behind after ``algo.max_stale_serving_s``.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows import console, shutdown, tracking
from flows import control as flow_control
from flows.config import RunConfig, Tree, check_task, validate
from flows.session import Session, make_trainers, open_session
from swarm import loop, update
from swarm.batching import Decision
from swarm.policy import PolicyBackend
from swarm.pool import evals
from swarm.records import Step
from swarm.train import Ledger, distributed
from swarm.train.health import RunHealth, Verdict
from swarm.update import run_update

__all__ = ["train_flow", "run_update", "follow_flow", "run_main", "STAGES", "update_settings"]


def _checkpoint(ledger: Ledger, extra: dict[str, str | None]) -> tuple[Path, Path | None] | None:
    """Commit + settle (:meth:`Ledger.commit`); log the checkpoint's adapter to the MLflow run."""
    done = ledger.commit(extra)
    if done is not None and done[1] is not None and extra.get("mlflow_run_id") is not None:
        tracking.log_dir(done[1], f"adapters/{ledger.trainer.policy}/{done[1].name}")
    return done


STAGES = update.Stages(checkpoint=_checkpoint)  # the pool retries its own transient errors


def update_settings(cfg: RunConfig) -> update.UpdateSettings:
    """The numbers an update reads from the config (the one place reading ``algo``'s advantage keys)."""
    b = cfg.batching
    return update.UpdateSettings(strategy=b.strategy, min_episodes=b.min_episodes, min_groups=b.min_groups,
                                 group_size=cfg.task.group_size, timeout_s=cfg.train.batch_timeout_s,
                                 max_staleness=cfg.train.max_staleness, group_by=cfg.algo.group_by,
                                 scale_std=cfg.algo.scale_std, rating_rule=cfg.feedback.rule(),
                                 correction_weight=cfg.feedback.correction_weight,
                                 correction_updates=cfg.feedback.correction_updates,
                                 max_corrections=cfg.feedback.max_corrections)


def _update_policies(s: Session, settings: update.UpdateSettings, on_poll: Callable[[Decision], None],
                     health: RunHealth | None = None) -> dict[str, float]:
    """One update of every policy in turn: their metrics as one row ({}: stopped or paused while waiting);
    ``health`` checks each policy's metrics and stops the session (:func:`_stop_unhealthy`) when told."""
    row: dict[str, float] = {}
    halt = s.control.halt(s.stop)  # a pause ends the wait for a batch, as a stop does
    for policy, led in s.ledgers.items():
        result = run_update(led, settings, halt, STAGES, on_poll, {"mlflow_run_id": s.run.info.run_id})
        if result is None:
            break
        m, steps = result
        t0 = time.perf_counter()
        _log_samples(steps, s.backend, policy, led.trainer.version, s.cfg.mlflow.sample_trajectories)
        m["time/samples_s"] = time.perf_counter() - t0
        row.update({k if len(s.ledgers) == 1 else f"{k}/{policy}": v for k, v in m.items()})
        if health is not None and _stop_unhealthy(s, health.check(policy, led.trainer.version, m)):
            break
    return row


def _stop_unhealthy(s: Session, verdict: Verdict) -> bool:
    """Say the verdict's warnings; on its stop, end the session FAILED with the reason (after the checkpoint)."""
    for text in verdict.warnings:
        console.warn(text)
        tracking.log_warning(text)
    if verdict.stop is None:
        return False
    s.reason, s.status = f"{verdict.stop}; the run stopped at update {s.updates()}", "FAILED"
    s.stop.set()
    return True


@flow(name="swarm-train", task_runner=ThreadPoolTaskRunner(max_workers=64), validate_parameters=False,
      log_prints=False)
def train_flow(cfg: RunConfig | Tree) -> console.RunSummary:
    """The whole training run (see the module docstring); a plain dict is validated first."""
    cfg = cfg if isinstance(cfg, RunConfig) else validate(cfg)
    check_task(cfg.task, cfg.runner)  # before anything starts: a bad task option would fail every episode
    with open_session(cfg, checkpoint=STAGES.checkpoint) as s:
        if s.run is not None:  # None: stopped while waiting for a client (train.wait_for_client)
            _loop(s)
    return console.summary(s.history, s.run.info.run_id if s.run else "", s.status, s.values)


def _loop(s: Session) -> None:
    """The updates of a started session, reading its control between them (see the module docstring)."""
    cfg, ctl = s.cfg, s.control
    settings = dataclasses.replace(update_settings(cfg), curation=s.curation[0], curated=s.curation[1])
    if cfg.train.wait_for_client:
        flow_control.log_event(s.control_lines, event="start", version=s.version(), holder=ctl.holder,
                               overrides=ctl.overrides)
    ctl.progress(s.updates(), s.version())
    health = RunHealth(cfg.algo.max_mismatch, cfg.algo.max_stale_serving_s)
    done0 = s.updates()
    with console.TrainProgress(max(cfg.train.updates - done0, 0), s.pool) as progress:
        t_eval, t_log = time.time(), None
        while s.updates() < ctl.knobs["updates"] and not s.stop.is_set():
            if ctl.paused:
                flow_control.log_event(s.control_lines, event="pause", version=s.version())
                ctl.hold_while_paused(s.stop)
                if not s.stop.is_set():
                    flow_control.log_event(s.control_lines, event="resume", version=s.version())
                continue  # the knobs changed while paused apply before the next update
            settings = flow_control.apply_changes(ctl.take_changes(), s.ledgers, settings, s.workers, s.version(),
                                                  ctl, s.control_lines)
            progress.set_total(ctl.knobs["updates"] - done0)  # a client may have retuned it
            row = _update_policies(s, settings, progress.on_poll, health)
            if not row:
                if ctl.paused:
                    continue
                break
            t0 = time.perf_counter()
            row.update(loop.episode_metrics(s.pool, t_eval, policies=cfg.policies))  # win rate, accuracy, ...
            t1 = time.perf_counter()
            evals.record_run_evals(s.pool, t_eval, cfg.policies, {"mlflow_run_id": s.run.info.run_id})  # per version
            t_eval = time.time()
            row.update({"time/episode_metrics_s": t1 - t0, "time/eval_writes_s": time.perf_counter() - t1})
            if t_log is not None:  # the previous row's logging: a row cannot time its own
                row["time/mlflow_s"] = t_log
            t0 = time.perf_counter()
            s.record(row)
            t_log = time.perf_counter() - t0
            progress.advance(row)
            ctl.progress(s.updates(), s.version())
    if ctl.state == "stopping":
        flow_control.log_event(s.control_lines, event="stop", version=s.version())
        if s.updates() < ctl.knobs["updates"]:
            s.status = "KILLED"  # stopped before its total, as Ctrl-C ends it


# -- torchrun data parallel (docs/scale_out.md "Training on GPUs"): ranks > 0 run this, not the flow --
def follow_flow(cfg: RunConfig) -> int:
    """Ranks > 0: rank 0's trainers (same order, same TrainConfig), trained on the batches it broadcasts."""
    tc = distributed.broadcast_object(None)  # train_flow's TrainConfig (pad id from rank 0's backend)
    trainers = make_trainers(cfg, tc)
    if cfg.train.resume:
        for tr in trainers.values():
            tr.resume()  # the checkpoint rank 0 resumes from (shared out_dir)
    return update.follow(trainers)


def _log_samples(steps: list[Step], backend: PolicyBackend, policy: str, version: int, n: int) -> None:
    """The first ``n`` trained episodes of an update, rendered readably, as an MLflow artifact."""
    by_ep: dict[str, list[Step]] = {}
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
