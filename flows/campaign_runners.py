"""How a campaign night runs its members: in this process or as ``python -m flows.train`` processes, in
segments that pause at early-stop checkpoints, within the night's time budget.

:func:`run_members` runs members ``concurrency`` at a time (one failing does not stop the others; none
starts after the budget). :func:`run_night` runs each member to each early-stop checkpoint in turn
(``train.updates=<checkpoint>`` in the member's own folder, so the next segment resumes from that
checkpoint and continues the same MLflow run), asks ``decide`` which of the members that just reached it
stop there, then runs the rest to their end. A member past a checkpoint on an earlier night was judged
there then and is not judged again. A member whose folder holds a checkpoint (a crash, a reboot, a budget stop on an
earlier night) resumes from it: ``train.resume`` does that, :func:`progress` says where it stands.
:func:`inprocess_runner` / :func:`process_runner` run one segment. It decides nothing and writes no report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import mlflow
from omegaconf import OmegaConf

from flows.campaign_members import MemberPlan, compose_config, config_flags, member_overrides
from research_agent.sweep import CampaignSpec, Member

__all__ = ["Outcome", "run_members", "run_night", "progress", "inprocess_runner", "process_runner", "Segment"]

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    key: str
    status: str            # FINISHED | FAILED | KILLED | SKIPPED (budget) | STOPPED (early stop)
    run_id: str | None = None
    error: str = ""        # the failure, or why it stopped early


# run one segment of a member: (plan, deadline, updates to run to; None = the member's own train.updates)
Segment = Callable[[MemberPlan, float | None, int | None], Outcome]


def run_members(members: list[Member], run_one: Callable[[Member, float | None], Outcome], concurrency: int = 1,
                budget_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> list[Outcome]:
    """Run members (``concurrency`` at a time); one failing does not stop the others; none starts
    after ``budget_s`` (those are SKIPPED). ``run_one(member, deadline)`` may stop at ``deadline``."""
    t0 = clock()
    deadline = None if budget_s is None else t0 + budget_s

    def one(m: Member) -> Outcome:
        if deadline is not None and clock() >= deadline:
            return Outcome(m.key, "SKIPPED", error="time budget spent")
        try:
            return run_one(m, deadline)
        except Exception as exc:  # a failed member is a result; the campaign goes on
            return Outcome(m.key, "FAILED", error=f"{type(exc).__name__}: {exc}")

    if concurrency <= 1:
        return [one(m) for m in members]
    with ThreadPoolExecutor(concurrency, thread_name_prefix="campaign-member") as ex:
        return list(ex.map(one, members))


def progress(folder: Path) -> int:
    """The update of the last committed checkpoint in a member's folder (0: none): where it resumes."""
    done = []
    for latest in (folder / "checkpoints").glob("*/LATEST"):
        try:
            done.append(int(latest.read_text().strip().rsplit("-", 1)[-1]))
        except ValueError:
            done.append(0)
    return min(done) if done else 0


def run_night(plans: list[MemberPlan], run_segment: Segment, concurrency: int = 1, budget_s: float | None = None,
              checkpoints: list[int] | None = None,
              decide: Callable[[int, list[MemberPlan]], dict[str, str]] | None = None,
              after: Callable[[MemberPlan, Outcome, bool], None] | None = None,
              where: Callable[[MemberPlan], int] = lambda p: progress(p.folder),
              clock: Callable[[], float] = time.monotonic) -> list[Outcome]:
    """Run ``plans`` to their end, pausing the active ones at each early-stop checkpoint (an update below
    their ``train.updates``) for ``decide(update, reached) -> {member key: why it stops}``; ``reached``: the
    members that got there tonight (one resumed past it was decided there on its night).

    ``after(plan, outcome, final)`` hears every segment's outcome (``final``: the member will not run
    again tonight); ``where(plan)`` is the update a member resumes from (it skips checkpoints it has
    passed). Returns each member's last outcome, in ``plans`` order.
    """
    t0 = clock()
    by_key = {p.member.key: p for p in plans}
    active = list(plans)
    last: dict[str, Outcome] = {}
    for target in [*sorted(set(checkpoints or [])), None]:
        seg = [p for p in active if target is None or (target < p.updates and where(p) < target)]
        left = None if budget_s is None else budget_s - (clock() - t0)
        outs = run_members([p.member for p in seg], lambda m, d, t=target: run_segment(by_key[m.key], d, t),
                           concurrency, left, clock)
        for o in outs:
            p = by_key[o.key]
            if o.run_id is None and o.key in last:
                o.run_id = last[o.key].run_id  # a later segment skipped or failed: the run it continues
            last[o.key] = o
            if o.status != "FINISHED":
                active.remove(p)
            if after is not None:
                after(p, o, target is None or o.status != "FINISHED")
        reached = [p for p in seg if p in active]
        if target is None or decide is None or not reached:
            continue  # the end, no rule, or no member got to this checkpoint tonight
        for key, why in decide(target, reached).items():
            p = by_key[key]
            o = Outcome(key, "STOPPED", last[key].run_id if key in last else None, why)
            last[key] = o
            active.remove(p)
            if after is not None:
                after(p, o, True)
    return [last[p.member.key] for p in plans if p.member.key in last]


def _with_updates(overrides: list[str], updates: int | None) -> list[str]:
    return overrides if updates is None else [*overrides, f"train.updates={updates}"]


def inprocess_runner(spec: CampaignSpec, user: list[str], conf_dir: Path | None, parent_id: str) -> Segment:
    """Segments as ``flows.train`` runs nested under the parent run, in this process."""
    from flows.train import train_flow

    def run(plan: MemberPlan, deadline: float | None, updates: int | None) -> Outcome:
        ov = _with_updates(member_overrides(spec, plan.member, user, plan.folder, plan.run_name), updates)
        cfg = OmegaConf.to_container(compose_config(ov, conf_dir), resolve=True)
        assert isinstance(cfg, dict)
        cfg["mlflow"]["nested"] = True
        try:
            summary = train_flow(cfg)
        finally:
            while (active := mlflow.active_run()) is not None and active.info.run_id != parent_id:
                mlflow.end_run("FAILED")  # a member that died before closing its run
        return Outcome(plan.member.key, str(summary.get("status", "FINISHED")), summary.get("run_id"))

    return run


def _prefect_api_url() -> str | None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if url:
        return url
    with get_client(sync_client=True) as c:  # the temporary server this process started
        return str(c.api_url)


def process_runner(spec: CampaignSpec, user: list[str], conf_dir: Path | None, parent_id: str) -> Segment:
    """Segments as ``python -m flows.train`` processes (a crash kills the member, not the night); output
    to ``<member folder>/train.log``; at the deadline SIGINT (the flow ends its MLflow run KILLED)."""
    env = {**os.environ, "PREFECT_API_URL": _prefect_api_url() or ""}
    env["MLFLOW_TRACKING_URI"] = mlflow.get_tracking_uri()

    def run(plan: MemberPlan, deadline: float | None, updates: int | None) -> Outcome:
        m = plan.member
        cmd = [sys.executable, "-m", "flows.train", *config_flags(conf_dir),
               *_with_updates(member_overrides(spec, m, user, plan.folder, plan.run_name), updates),
               f"++mlflow.parent_run_id={parent_id}", f"hydra.run.dir={plan.folder / 'hydra'}"]
        plan.folder.mkdir(parents=True, exist_ok=True)
        with open(plan.folder / "train.log", "ab") as f:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
            while proc.poll() is None:
                if deadline is not None and time.monotonic() > deadline:
                    proc.send_signal(signal.SIGINT)  # the flow ends its MLflow run as KILLED
                    try:
                        proc.wait(120)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                    return Outcome(m.key, "KILLED", error="time budget spent")
                time.sleep(0.5)
        if proc.returncode != 0:
            raise RuntimeError(f"flows.train exited with {proc.returncode}; see {plan.folder / 'train.log'}")
        return Outcome(m.key, "FINISHED")

    return run
