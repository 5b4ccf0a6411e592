"""``python -m flows.campaign +campaign=<name> [key=value ...] [--schedule]``: sweeps as nested runs.

One night of a campaign (:func:`campaign_flow`): compose ``conf/train.yaml`` + ``conf/campaign/<name>.yaml``,
find or open the campaign's parent MLflow run (tag ``swarm.campaign``), skip members already
FINISHED there (earlier nights), run the rest as real ``flows.train`` runs nested under the parent
(in this process, or as ``python -m flows.train`` processes when ``concurrency > 1``) until the
time budget is spent, mark failures FAILED and go on, then analyse everything in MLflow
(:mod:`research_agent.analysis`) and log the report with its plots as parent-run artifacts and
under ``campaign.out_dir`` (default ``experiments/campaigns/<name>/``). With ``plan.propose`` the
LLM planner then proposes the next campaign file (applied only with ``plan.auto``).

``--schedule`` serves the same flow as a Prefect deployment on ``campaign.schedule.cron``; a
scheduled night after ``schedule.nights`` nights does nothing. Command-line overrides other than
``campaign.*`` go to every member (e.g. ``mlflow.tracking_uri=...``, ``model.path=...``).
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
from typing import Any

import mlflow
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from prefect import flow, get_run_logger

from flows import tracking
from research_agent.analysis import collect, write_report
from research_agent.sweep import CampaignSpec, Member, campaign_dir, expand, parse_campaign

__all__ = ["campaign_flow", "compose_config", "member_overrides", "run_members", "Outcome", "schedule_kwargs",
           "deployment", "main"]

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


@dataclass
class Outcome:
    key: str
    status: str            # FINISHED | FAILED | KILLED | SKIPPED (budget)
    run_id: str | None = None
    error: str = ""


def compose_config(overrides: list[str], conf_dir: Path | str = CONF) -> Any:
    """``conf/train.yaml`` composed with ``overrides`` (unresolved DictConfig)."""
    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base=None):
        return compose(config_name="train", overrides=overrides)


def _load_campaign(name: str, overrides: list[str], conf_dir: Path | str) -> tuple[CampaignSpec, dict[str, Any], Path]:
    forced = [f"++{o}" if o.startswith("campaign.") else o for o in overrides]  # any campaign key, set or not
    cfg = compose_config([f"+campaign={name}", *forced, "train.out_dir=."], conf_dir)
    spec = parse_campaign(OmegaConf.to_container(cfg.campaign, resolve=True))  # type: ignore[arg-type]
    out = campaign_dir(spec)
    return spec, OmegaConf.to_container(cfg.mlflow, resolve=True), out  # type: ignore[return-value]


def member_overrides(spec: CampaignSpec, m: Member, user: list[str], out: Path) -> list[str]:
    """The overrides that make member ``m`` a ``flows.train`` config."""
    return [*spec.base, *user, *m.overrides, f"train.out_dir={out / 'members' / m.key}",
            f"run_name='{spec.name}/{m.label}'", f"++campaign_member.campaign={spec.name}",
            f"++campaign_member.key={m.key}", f"++campaign_member.config='{m.config_label}'"]


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


def _record_failure(spec: CampaignSpec, m: Member, outcome: Outcome, parent_id: str, t0: float) -> None:
    """Mark the member's run FAILED with the error; create the run when it failed before opening one."""
    client = mlflow.tracking.MlflowClient()
    exp = client.get_run(parent_id).info.experiment_id
    runs = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent_id}' and params.`campaign_member.key` = "
                                     f"'{m.key}' and attributes.start_time >= {int(t0 * 1000)}")
    if runs:
        run_id = runs[0].info.run_id
        if runs[0].info.status not in ("FAILED", "KILLED"):
            client.set_terminated(run_id, "FAILED")
    else:
        run = client.create_run(exp, run_name=f"{spec.name}/{m.label}", tags={"mlflow.parentRunId": parent_id})
        run_id = run.info.run_id
        params = {"campaign_member.key": m.key, "campaign_member.config": m.config_label, "seed": str(m.seed),
                  **{k: str(v) for k, v in m.values.items()}}
        for k, v in params.items():
            client.log_param(run_id, k, v)
        client.set_terminated(run_id, "FAILED")
    client.set_tag(run_id, "swarm.error", outcome.error[:5000])
    outcome.run_id = run_id


def _inprocess_runner(spec: CampaignSpec, user: list[str], out: Path, conf_dir: Path, parent_id: str) -> Callable:
    from flows.train import train_flow

    def run(m: Member, deadline: float | None) -> Outcome:
        cfg = OmegaConf.to_container(compose_config(member_overrides(spec, m, user, out), conf_dir), resolve=True)
        assert isinstance(cfg, dict)
        cfg["mlflow"]["nested"] = True
        try:
            summary = train_flow(cfg)
        finally:
            while (active := mlflow.active_run()) is not None and active.info.run_id != parent_id:
                mlflow.end_run("FAILED")  # a member that died before closing its run
        return Outcome(m.key, summary["status"], summary["run_id"])

    return run


def _prefect_api_url() -> str | None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if url:
        return url
    with get_client(sync_client=True) as c:  # the temporary server this process started
        return str(c.api_url)


def _process_runner(spec: CampaignSpec, user: list[str], out: Path, conf_dir: Path, parent_id: str) -> Callable:
    env = {**os.environ, "PREFECT_API_URL": _prefect_api_url() or ""}
    env["MLFLOW_TRACKING_URI"] = mlflow.get_tracking_uri()

    def run(m: Member, deadline: float | None) -> Outcome:
        cmd = [sys.executable, "-m", "flows.train", "--config-dir", str(conf_dir),
               *member_overrides(spec, m, user, out), f"++mlflow.parent_run_id={parent_id}",
               f"hydra.run.dir={out / 'members' / m.key / 'hydra'}"]
        log = (out / "members" / m.key)
        log.mkdir(parents=True, exist_ok=True)
        with open(log / "train.log", "ab") as f:
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
            raise RuntimeError(f"flows.train exited with {proc.returncode}; see {log / 'train.log'}")
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


@flow(name="swarm-campaign", validate_parameters=False, log_prints=True)
def campaign_flow(campaign: str, overrides: list[str] | None = None, scheduled: bool = False,
                  conf_dir: str | None = None) -> dict[str, Any]:
    """One night of campaign ``campaign`` (see the module docstring)."""
    log = get_run_logger()
    conf = Path(conf_dir or CONF)
    user = [o for o in (overrides or []) if not o.lstrip("+~").startswith("campaign")]
    spec, mcfg, out = _load_campaign(campaign, list(overrides or []), conf)
    mlflow.set_tracking_uri(tracking.tracking_uri(mcfg["tracking_uri"]))
    mlflow.set_experiment(mcfg["experiment"])
    parent_id, nights = _parent_run(spec.name, mcfg["experiment"])
    if scheduled and nights >= spec.schedule.nights:
        log.info("campaign %s has run its %d nights; nothing to do", spec.name, spec.schedule.nights)
        return {"campaign": spec.name, "status": "complete", "parent_run_id": parent_id, "nights": nights}
    swept = list(spec.sweep.params)
    members = expand(spec)
    t0 = time.time()
    with mlflow.start_run(run_id=parent_id):
        mlflow.set_tag("swarm.nights", str(nights + 1))
        mlflow.log_dict(spec.model_dump(mode="json"), f"campaign/night-{nights + 1}.json")
        done = {r.key for r in collect(mlflow.get_tracking_uri(), parent_id, spec.metric, swept)
                if r.status == "FINISHED"}
        todo = [m for m in members if m.key not in done]
        log.info("campaign %s night %d: %d members, %d already done, %d to run", spec.name, nights + 1,
                 len(members), len(done), len(todo))
        make = _process_runner if spec.concurrency > 1 else _inprocess_runner
        runner = make(spec, user, out, conf, parent_id)
        budget = spec.budget_min * 60 if spec.budget_min else None
        outcomes = run_members(todo, runner, spec.concurrency, budget)
        by_key = {m.key: m for m in todo}
        for o in outcomes:
            if o.status == "FAILED":
                log.warning("member %s failed: %s", by_key[o.key].label, o.error)
                _record_failure(spec, by_key[o.key], o, parent_id, t0)
        results = collect(mlflow.get_tracking_uri(), parent_id, spec.metric, swept)
        notes = (f"{spec.description}\n\nNight {nights + 1} of {spec.schedule.nights}; parent MLflow run "
                 f"`{parent_id}`.")
        report, plots, rows = write_report(spec.name, results, swept, spec.metric, out, notes)
        mlflow.log_artifacts(str(out / "plots"), "report/plots")
        mlflow.log_artifact(str(report), "report")
        mlflow.log_artifact(str(out / "analysis.json"), "report")
        counts = {s: sum(o.status == s for o in outcomes) for s in ("FINISHED", "FAILED", "KILLED", "SKIPPED")}
        mlflow.log_metrics({f"campaign/{k.lower()}": float(v) for k, v in counts.items()}, step=nights + 1)
        if rows and rows[0].final_mean is not None:
            mlflow.log_metric("campaign/best_final", rows[0].final_mean, step=nights + 1)
        proposal = _propose(spec, report, conf, log) if spec.plan.propose else None
    log.info("campaign %s night %d: %s; report %s", spec.name, nights + 1, counts, report)
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
    spec, _, _ = _load_campaign(campaign, overrides, conf_dir or CONF)
    # _sync: Prefect picks its async variant whenever it sees an event loop (e.g. in a test session)
    return campaign_flow.to_deployment(**schedule_kwargs(spec, overrides, conf_dir), _sync=True)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    serve = "--schedule" in args
    args = [a for a in args if a != "--schedule"]
    names = [a.split("=", 1)[1] for a in args if a.startswith("+campaign=")]
    if not names:
        raise SystemExit("usage: python -m flows.campaign +campaign=<name> [key=value ...] [--schedule]\n"
                         f"campaigns: {', '.join(sorted(p.stem for p in (CONF / 'campaign').glob('*.yaml')))}")
    overrides = [a for a in args if not a.startswith("+campaign=")]
    from flows.campaign import campaign_flow as flow_fn  # the importable flow, also when run as __main__

    if serve:
        from prefect.settings import PREFECT_API_URL

        if not PREFECT_API_URL.value():
            raise SystemExit("--schedule needs a running Prefect server (a temporary one cannot schedule):\n"
                             "  prefect server start            # UI on http://127.0.0.1:4200\n"
                             "  PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.campaign "
                             f"+campaign={names[0]} --schedule")
        spec, _, _ = _load_campaign(names[0], overrides, CONF)
        print(f"serving campaign {spec.name}: {spec.schedule.cron} ({spec.schedule.timezone}), "
              f"{spec.schedule.nights} nights. Watch it in the Prefect UI (`prefect server start`, "
              "http://127.0.0.1:4200 -> Deployments -> swarm-campaign/" + spec.name + "). Ctrl-C stops serving.")
        flow_fn.serve(**schedule_kwargs(spec, overrides))
        return
    print(flow_fn(names[0], overrides))


if __name__ == "__main__":
    main()
