"""``python -m flows.campaign [--config-dir DIR] +campaign=<name> [key=value ...] [--schedule]``: sweeps.

One night of a campaign (:func:`campaign_flow`): compose ``conf/train.yaml`` + ``conf/campaign/<name>.yaml``
(``--config-dir DIR`` is searched first, then the repository's ``conf/``, so a generated task kept
outside the repository can be swept), find or open the campaign's parent MLflow run (tag
``swarm.campaign``), compose every member's full config and hash it
(:func:`research_agent.sweep.config_hash`), skip members whose hash matches a FINISHED run there
(tag ``swarm.member_hash``; a changed base config or ``train.updates`` reruns them), run the rest
as real ``flows.train`` runs nested under the parent (in this process, or as ``python -m
flows.train`` processes when ``concurrency > 1``) until the time budget is spent, mark failures
FAILED and go on, then analyse the current members' runs (:mod:`research_agent.analysis`) and log
the report with its plots as parent-run artifacts and under ``campaign.out_dir`` (default
``experiments/campaigns/<name>/``). With ``plan.propose`` the LLM planner then proposes the next
campaign file (applied only with ``plan.auto``).

Each member run is named for what differs (``echo lr=0.001 seed=0``) and tagged ``swarm.task``,
``swarm.model``, ``swarm.campaign``, ``swarm.member_hash``. The terminal shows each member with its
overrides as it starts and a table of results at the end. Composing members (search path, overrides,
config hash, run names) lives in :mod:`flows.campaign_members`.

``--schedule`` serves the same flow as a Prefect deployment on ``campaign.schedule.cron``; a
scheduled night after ``schedule.nights`` nights does nothing. Command-line overrides other than
``campaign.*`` go to every member (e.g. ``mlflow.tracking_uri=...``, ``model.path=...``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from omegaconf import OmegaConf
from prefect import flow, get_run_logger
from rich.console import Console
from rich.table import Table

from flows import tracking
from flows.campaign_members import (
    MemberPlan,
    compose_config,
    config_flags,
    load_campaign,
    member_overrides,
    plan_members,
)
from research_agent.analysis import MemberResult, collect, current, write_report
from research_agent.sweep import CampaignSpec, Member, expand

__all__ = ["campaign_flow", "compose_config", "member_overrides", "plan_members", "MemberPlan", "run_members",
           "Outcome", "schedule_kwargs", "deployment", "main"]

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


@dataclass
class Outcome:
    key: str
    status: str            # FINISHED | FAILED | KILLED | SKIPPED (budget)
    run_id: str | None = None
    error: str = ""


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


def _record_failure(spec: CampaignSpec, plan: MemberPlan, outcome: Outcome, parent_id: str, t0: float) -> None:
    """Mark the member's run FAILED with the error; create the run when it failed before opening one."""
    m = plan.member
    client = mlflow.tracking.MlflowClient()
    exp = client.get_run(parent_id).info.experiment_id
    runs = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent_id}' and params.`campaign_member.key` = "
                                     f"'{m.key}' and attributes.start_time >= {int(t0 * 1000)}")
    if runs:
        run_id = runs[0].info.run_id
        if runs[0].info.status not in ("FAILED", "KILLED"):
            client.set_terminated(run_id, "FAILED")
    else:
        run = client.create_run(exp, run_name=plan.run_name, tags={"mlflow.parentRunId": parent_id})
        run_id = run.info.run_id
        params = {"campaign_member.key": m.key, "campaign_member.config": m.config_label, "seed": str(m.seed),
                  **{k: str(v) for k, v in m.values.items()}}
        for k, v in params.items():
            client.log_param(run_id, k, v)
        client.set_terminated(run_id, "FAILED")
    client.set_tag(run_id, "swarm.error", outcome.error[:5000])
    outcome.run_id = run_id


def _tag_member(plan: MemberPlan, outcome: Outcome) -> None:
    """Tag the member's run (task, model, campaign, config hash); the run id comes from its folder when
    the member ran in another process."""
    if outcome.run_id is None and (plan.folder / "mlflow_run.json").exists():
        outcome.run_id = json.loads((plan.folder / "mlflow_run.json").read_text()).get("run_id")
    if outcome.run_id is None:
        return
    client = mlflow.tracking.MlflowClient()
    for k, v in plan.tags.items():
        client.set_tag(outcome.run_id, k, v)


def _inprocess_runner(spec: CampaignSpec, user: list[str], plans: dict[str, MemberPlan], conf_dir: Path | None,
                      parent_id: str) -> Callable[[Member, float | None], Outcome]:
    from flows.train import train_flow

    def run(m: Member, deadline: float | None) -> Outcome:
        plan = plans[m.key]
        cfg = OmegaConf.to_container(compose_config(member_overrides(spec, m, user, plan.folder, plan.run_name),
                                                    conf_dir), resolve=True)
        assert isinstance(cfg, dict)
        cfg["mlflow"]["nested"] = True
        try:
            summary = train_flow(cfg)
        finally:
            while (active := mlflow.active_run()) is not None and active.info.run_id != parent_id:
                mlflow.end_run("FAILED")  # a member that died before closing its run
        return Outcome(m.key, str(summary.get("status", "FINISHED")), summary.get("run_id"))

    return run


def _prefect_api_url() -> str | None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if url:
        return url
    with get_client(sync_client=True) as c:  # the temporary server this process started
        return str(c.api_url)


def _process_runner(spec: CampaignSpec, user: list[str], plans: dict[str, MemberPlan], conf_dir: Path | None,
                    parent_id: str) -> Callable[[Member, float | None], Outcome]:
    env = {**os.environ, "PREFECT_API_URL": _prefect_api_url() or ""}
    env["MLFLOW_TRACKING_URI"] = mlflow.get_tracking_uri()

    def run(m: Member, deadline: float | None) -> Outcome:
        plan = plans[m.key]
        cmd = [sys.executable, "-m", "flows.train", *config_flags(conf_dir),
               *member_overrides(spec, m, user, plan.folder, plan.run_name), f"++mlflow.parent_run_id={parent_id}",
               f"hydra.run.dir={plan.folder / 'hydra'}"]
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
                time.sleep(1)
        if proc.returncode != 0:
            raise RuntimeError(f"flows.train exited with {proc.returncode}; see {plan.folder / 'train.log'}")
        return Outcome(m.key, "FINISHED")

    return run


def _parent_run(name: str, experiment: str) -> tuple[str, int]:
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


def _propose(spec: CampaignSpec, report: Path, conf_dir: Path, log: Any) -> Path | None:
    try:
        from research_agent.campaign import propose_next
        from research_agent.llm import ChatLLM, load_agent_config, load_settings

        llm = ChatLLM(load_settings(load_agent_config(conf_dir=conf_dir)))
        return propose_next(llm, spec.name, report.parent, conf_dir, auto=spec.plan.auto).path
    except Exception as exc:  # planning is advice; the night's results stand without it
        log.warning("campaign planner did not propose: %s", exc)
        return None


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.3f}"


def _results_table(plans: list[MemberPlan], results: list[MemberResult], outcomes: list[Outcome],
                   metric: str) -> Table:
    """One row per member: its overrides, what happened tonight (or "done earlier"), final and best metric."""
    by_hash = {r.member_hash: r for r in results}
    tonight = {o.key: o for o in outcomes}
    table = Table(title=f"members ({metric})", title_justify="left")
    for col in ("#", "member", "status", "final", "best", "run"):
        table.add_column(col, justify="right" if col in ("#", "final", "best") else "left")
    for i, p in enumerate(plans, 1):
        r, o = by_hash.get(p.hash), tonight.get(p.member.key)
        status = o.status if o else ("done earlier" if r is not None and r.status == "FINISHED" else "not run")
        style = {"FINISHED": "green", "FAILED": "red", "KILLED": "yellow", "SKIPPED": "yellow"}.get(status, "dim")
        run_id = (o.run_id if o and o.run_id else r.run_id if r else "") or ""
        table.add_row(str(i), " ".join(p.member.overrides), f"[{style}]{status}[/]", _num(r.final if r else None),
                      _num(r.best if r else None), run_id[:12])
    return table


@flow(name="swarm-campaign", validate_parameters=False, log_prints=True)
def campaign_flow(campaign: str, overrides: list[str] | None = None, scheduled: bool = False,
                  conf_dir: str | None = None) -> dict[str, Any]:
    """One night of campaign ``campaign`` (see the module docstring); ``conf_dir`` is searched before ``conf/``."""
    log = get_run_logger()
    console = Console(highlight=False)
    conf = Path(conf_dir).resolve() if conf_dir else None
    user = [o for o in (overrides or []) if not o.lstrip("+~").startswith("campaign")]
    spec, mcfg, out = load_campaign(campaign, list(overrides or []), conf)
    mlflow.set_tracking_uri(tracking.tracking_uri(mcfg["tracking_uri"]))
    mlflow.set_experiment(experiment_id=tracking.ensure_experiment(mcfg["experiment"]))  # artifacts beside the DB
    parent_id, nights = _parent_run(spec.name, mcfg["experiment"])
    if scheduled and nights >= spec.schedule.nights:
        log.info("campaign %s has run its %d nights; nothing to do", spec.name, spec.schedule.nights)
        return {"campaign": spec.name, "status": "complete", "parent_run_id": parent_id, "nights": nights}
    swept = list(spec.sweep.params)
    plans = plan_members(spec, expand(spec), user, out, conf)
    by_key = {p.member.key: p for p in plans}
    t0 = time.time()
    with mlflow.start_run(run_id=parent_id):
        mlflow.set_tag("swarm.nights", str(nights + 1))
        mlflow.log_dict(spec.model_dump(mode="json"), f"campaign/night-{nights + 1}.json")
        done = {r.member_hash for r in collect(mlflow.get_tracking_uri(), parent_id, spec.metric, swept)
                if r.status == "FINISHED" and r.member_hash}
        todo = [p for p in plans if p.hash not in done]
        console.print(f"[bold]campaign {spec.name}[/] night {nights + 1}: {len(plans)} members, "
                      f"{len(plans) - len(todo)} already done with this exact config, {len(todo)} to run "
                      f"(MLflow parent run {parent_id}; member folders and logs under {out / 'members'})")
        make = _process_runner if spec.concurrency > 1 else _inprocess_runner
        runner = make(spec, user, by_key, conf, parent_id)
        position = {p.member.key: i for i, p in enumerate(todo, 1)}

        def announced(m: Member, deadline: float | None) -> Outcome:
            console.print(f"[bold cyan]member {position[m.key]}/{len(todo)}[/]: {' '.join(m.overrides)}")
            return runner(m, deadline)

        budget = spec.budget_min * 60 if spec.budget_min else None
        outcomes = run_members([p.member for p in todo], announced, spec.concurrency, budget)
        for o in outcomes:
            if o.status == "FAILED":
                log.warning("member %s failed: %s", " ".join(by_key[o.key].member.overrides), o.error)
                _record_failure(spec, by_key[o.key], o, parent_id, t0)
            if o.status != "SKIPPED":
                _tag_member(by_key[o.key], o)
        results, older = current(collect(mlflow.get_tracking_uri(), parent_id, spec.metric, swept),
                                 {p.hash for p in plans})
        notes = (f"{spec.description}\n\nNight {nights + 1} of {spec.schedule.nights}; parent MLflow run "
                 f"`{parent_id}`.")
        report, plots, rows = write_report(spec.name, results, swept, spec.metric, out, notes, older=older)
        mlflow.log_artifacts(str(out / "plots"), "report/plots")
        mlflow.log_artifact(str(report), "report")
        mlflow.log_artifact(str(out / "analysis.json"), "report")
        counts = {s: sum(o.status == s for o in outcomes) for s in ("FINISHED", "FAILED", "KILLED", "SKIPPED")}
        mlflow.log_metrics({f"campaign/{k.lower()}": float(v) for k, v in counts.items()}, step=nights + 1)
        if rows and rows[0].final_mean is not None:
            mlflow.log_metric("campaign/best_final", rows[0].final_mean, step=nights + 1)
        console.print(_results_table(plans, results, outcomes, spec.metric))
        if rows and rows[0].final_mean is not None:
            console.print(f"best: [bold]{rows[0].config}[/] (final {rows[0].final_mean:.3f})")
        console.print(f"report: {report}")
        proposal = _propose(spec, report, conf or CONF, log) if spec.plan.propose else None
    log.info("campaign %s night %d: %s; report %s", spec.name, nights + 1,
             ", ".join(f"{v} {k.lower()}" for k, v in counts.items() if v) or "nothing ran", report)
    return {"campaign": spec.name, "status": "ran", "parent_run_id": parent_id, "nights": nights + 1,
            "outcomes": [o.__dict__ for o in outcomes], "report": str(report), "plots": [str(p) for p in plots],
            "best": rows[0].config if rows else None, "proposal": str(proposal) if proposal else None}


def schedule_kwargs(spec: CampaignSpec, overrides: list[str], conf_dir: str | None = None) -> dict[str, Any]:
    """What both ``serve`` and ``to_deployment`` get: the cron schedule and the night's parameters."""
    from prefect.schedules import Cron

    return {"name": spec.name, "schedules": [Cron(spec.schedule.cron, timezone=spec.schedule.timezone)],
            "parameters": {"campaign": spec.name, "overrides": overrides, "scheduled": True, "conf_dir": conf_dir},
            "description": f"{spec.description} ({spec.schedule.nights} nights, {spec.schedule.cron} "
                           f"{spec.schedule.timezone})", "tags": ["campaign"]}


def deployment(campaign: str, overrides: list[str], conf_dir: str | None = None) -> Any:
    """The campaign as a Prefect deployment (``.apply()`` registers it; :func:`main` serves it)."""
    spec, _, _ = load_campaign(campaign, overrides, conf_dir)
    # _sync: Prefect picks its async variant whenever it sees an event loop (e.g. in a test session)
    return campaign_flow.to_deployment(**schedule_kwargs(spec, overrides, conf_dir), _sync=True)


USAGE = "usage: python -m flows.campaign [--config-dir DIR] +campaign=<name> [key=value ...] [--schedule]"


def _split_args(args: list[str]) -> tuple[str | None, list[str]]:
    """``--config-dir DIR`` / ``--config-dir=DIR`` out of ``args`` (checked to be a folder)."""
    conf_dir, rest, it = None, [], iter(args)
    for a in it:
        if a == "--config-dir":
            conf_dir = next(it, None)
            if conf_dir is None:
                raise SystemExit(f"--config-dir needs a folder\n{USAGE}")
        elif a.startswith("--config-dir="):
            conf_dir = a.split("=", 1)[1]
        else:
            rest.append(a)
    if conf_dir is not None and not Path(conf_dir).is_dir():
        raise SystemExit(f"--config-dir {conf_dir}: not a folder")
    return (str(Path(conf_dir).resolve()) if conf_dir else None), rest


def main(argv: list[str] | None = None) -> None:
    conf_dir, args = _split_args(list(sys.argv[1:] if argv is None else argv))
    serve = "--schedule" in args
    args = [a for a in args if a != "--schedule"]
    names = [a.split("=", 1)[1] for a in args if a.startswith("+campaign=")]
    if not names:
        found = {p.stem for d in (Path(conf_dir) if conf_dir else CONF, CONF) for p in (d / "campaign").glob("*.yaml")}
        raise SystemExit(f"{USAGE}\ncampaigns: {', '.join(sorted(found))}")
    overrides = [a for a in args if not a.startswith("+campaign=")]
    from flows.campaign import campaign_flow as flow_fn  # the importable flow, also when run as __main__

    if serve:
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            raise SystemExit("--schedule needs a running Prefect server (a temporary one cannot schedule):\n"
                             "  prefect server start            # UI on http://127.0.0.1:4200\n"
                             "  PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.campaign "
                             f"+campaign={names[0]} --schedule")
        spec, _, _ = load_campaign(names[0], overrides, conf_dir)
        print(f"serving campaign {spec.name}: {spec.schedule.cron} ({spec.schedule.timezone}), "
              f"{spec.schedule.nights} nights. Watch it in the Prefect UI (`prefect server start`, "
              "http://127.0.0.1:4200 -> Deployments -> swarm-campaign/" + spec.name + "). Ctrl-C stops serving.")
        flow_fn.serve(**schedule_kwargs(spec, overrides, conf_dir))
        return
    flow_fn(names[0], overrides, conf_dir=conf_dir)  # the flow prints each member and the results table


if __name__ == "__main__":
    main()
