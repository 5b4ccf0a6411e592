"""A campaign's MLflow bookkeeping: its parent run, each member run's tags and state, failures, and the
night's report on the parent run (the comparison table, its plot, the one-line answer).

Member state (tag ``swarm.member_state``): ``complete`` (ran to its ``train.updates``), ``stopped``
(stopped early at a checkpoint; why in ``swarm.stopped``) or ``partial`` (crashed, killed, paused at a
checkpoint or out of budget: the next night resumes it from its last checkpoint). It runs no member
and computes nothing (:mod:`research_agent.analysis` does).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow

from flows.campaign_members import MemberPlan
from flows.campaign_runners import Outcome
from research_agent.analysis import MemberResult, Study

__all__ = ["parent_run", "settle", "is_done", "log_report"]


def parent_run(name: str, experiment: str) -> tuple[str, int]:
    """The campaign's parent run (created on the first night) and how many nights it has run."""
    client = mlflow.tracking.MlflowClient()
    exp = mlflow.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.`swarm.campaign` = '{name}' and tags.`swarm.kind` = 'campaign'",
                              order_by=["attributes.start_time ASC"], max_results=1)
    if runs:
        return runs[0].info.run_id, int(runs[0].data.tags.get("swarm.nights", "0"))
    run = client.create_run(exp.experiment_id, run_name=f"campaign-{name}",
                            tags={"swarm.campaign": name, "swarm.kind": "campaign", "swarm.nights": "0"})
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id, 0


def is_done(r: MemberResult) -> bool:
    """Whether a member's run needs nothing more: finished, or stopped early whatever its run's status (one
    that crashed past a checkpoint and was stopped there on its next night stays FAILED); a partial one
    resumes."""
    return r.state == "stopped" or (r.status == "FINISHED" and r.state in ("", "complete"))


def _run_of(plan: MemberPlan, parent_id: str) -> str | None:
    """The run a member's folder names (it opened or continued it), if it is this campaign's."""
    f = plan.folder / "mlflow_run.json"
    if not f.exists():
        return None
    run_id = json.loads(f.read_text()).get("run_id")
    try:
        run = mlflow.tracking.MlflowClient().get_run(run_id)
    except mlflow.exceptions.MlflowException:
        return None  # another tracking store
    return run_id if run.data.tags.get("mlflow.parentRunId") == parent_id else None


def _failed_run(plan: MemberPlan, outcome: Outcome, parent_id: str) -> str:
    """Mark the member's run FAILED with the error; create the run when it failed before opening one."""
    m = plan.member
    client = mlflow.tracking.MlflowClient()
    run_id = outcome.run_id or _run_of(plan, parent_id)
    if run_id is not None:
        if client.get_run(run_id).info.status not in ("FAILED", "KILLED"):
            client.set_terminated(run_id, "FAILED")
    else:
        exp = client.get_run(parent_id).info.experiment_id
        run_id = client.create_run(exp, run_name=plan.run_name, tags={"mlflow.parentRunId": parent_id}).info.run_id
        params = {"campaign_member.key": m.key, "campaign_member.config": m.config_label, "seed": str(m.seed),
                  **{k: str(v) for k, v in m.values.items()}}
        for k, v in params.items():
            client.log_param(run_id, k, v)
        client.set_terminated(run_id, "FAILED")
    client.set_tag(run_id, "swarm.error", outcome.error[:5000])
    return run_id


def settle(plan: MemberPlan, outcome: Outcome, final: bool, parent_id: str) -> None:
    """After a segment: tag the member's run (task, model, campaign, config hash) and its state; a failure
    marks it FAILED. ``final``: it will not run again tonight (a FINISHED one is then complete)."""
    if outcome.status == "FAILED":
        outcome.run_id = _failed_run(plan, outcome, parent_id)
    if outcome.run_id is None:
        outcome.run_id = _run_of(plan, parent_id)
    if outcome.run_id is None:
        return  # skipped before it ever ran
    client = mlflow.tracking.MlflowClient()
    state = {"FINISHED": "complete" if final else "partial", "STOPPED": "stopped"}.get(outcome.status, "partial")
    for k, v in {**plan.tags, "swarm.member_state": state}.items():
        client.set_tag(outcome.run_id, k, v)
    if outcome.status == "STOPPED":
        client.set_tag(outcome.run_id, "swarm.stopped", outcome.error[:5000])


def log_report(st: Study, out: Path, night: int, counts: dict[str, int]) -> None:
    """The night's report on the active parent run: ``report/`` (report.md, analysis.json, plots/), the
    comparison table (``report/comparison.json``, an MLflow table), the answer (tag ``swarm.answer``) and
    ``campaign/*`` counts (step = night)."""
    mlflow.log_artifacts(str(out / "plots"), "report/plots")
    mlflow.log_artifact(str(out / "report.md"), "report")
    mlflow.log_artifact(str(out / "analysis.json"), "report")
    table: dict[str, list[Any]] = {k: [] for k in ("configuration", "seeds", "mean", "diff", "lo", "hi", "paired",
                                                     "verdict")}
    for r in st.rows:
        iv = r.interval
        for k, v in (("configuration", r.config), ("seeds", r.seeds), ("mean", r.mean), ("diff", iv and iv.diff),
                     ("lo", iv and iv.lo), ("hi", iv and iv.hi), ("paired", iv and iv.paired), ("verdict", r.verdict)):
            table[k].append(v)
    mlflow.log_table(table, "report/comparison.json")
    mlflow.set_tags({"swarm.answer": st.answer.line[:5000], "swarm.verdict": st.answer.verdict,
                     "swarm.compared_on": st.metric, "swarm.baseline": st.baseline,
                     **({"swarm.question": st.question[:5000]} if st.question else {})})
    metrics = {f"campaign/{k.lower()}": float(v) for k, v in counts.items()}
    metrics["campaign/resolved"] = float(sum(r.verdict in ("better", "worse") for r in st.rows))
    mlflow.log_metrics(metrics, step=night)
