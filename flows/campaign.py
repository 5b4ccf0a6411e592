"""``python -m flows.campaign [--config-dir DIR] +campaign=<name> [key=value ...] [--schedule]``: sweeps.

One night of a campaign (:func:`campaign_flow`): compose ``conf/train.yaml`` + ``conf/campaign/<name>.yaml``
(``--config-dir DIR`` is searched first, then the repository's ``conf/``, so a generated task kept
outside the repository can be swept), find or open the campaign's parent MLflow run (tag
``swarm.campaign``), compose every member's full config and hash it
(:func:`research_agent.sweep.config_hash`), skip members whose hash matches a run there that is done
(FINISHED and complete, or stopped early; tag ``swarm.member_hash``; a changed base config or
``train.updates`` reruns them), run the rest as real ``flows.train`` runs nested under the parent (in this
process, or as ``python -m flows.train`` processes when ``concurrency > 1``) until the time budget is
spent (:mod:`flows.campaign_runners`): with ``early_stop`` every member pauses at each of its
checkpoints, where the stated rule (successive halving, or "clearly behind the baseline") stops some;
a member that crashed or was killed on an earlier night resumes from its last checkpoint. Then compare
each configuration with the baseline over seeds and answer the campaign's decision rule
(:func:`research_agent.analysis.study`), and write the report with its plots under ``campaign.out_dir``
(default ``experiments/campaigns/<name>/``) and on the parent run (:mod:`flows.campaign_tracking`).
With ``plan.propose`` the LLM planner then proposes the next campaign file, citing the answer (applied
only with ``plan.auto``).

Each member run is named for what differs (``echo lr=0.001 seed=0``) and tagged ``swarm.task``,
``swarm.model``, ``swarm.campaign``, ``swarm.member_hash``, ``swarm.member_state``. The terminal shows each
member with its overrides as it starts, a table of results, the comparison with the baseline and the
answer. Composing members (search path, overrides, config hash, run names) lives in
:mod:`flows.campaign_members`.

``--schedule`` serves the same flow as a Prefect deployment on ``campaign.schedule.cron``; a
scheduled night after ``schedule.nights`` nights does nothing. Command-line overrides other than
``campaign.*`` go to every member (e.g. ``mlflow.tracking_uri=...``, ``model.path=...``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
from prefect import flow, get_run_logger
from rich.console import Console
from rich.table import Table

from flows import tracking
from flows.campaign_members import (
    MemberPlan,
    compose_config,
    load_campaign,
    member_overrides,
    plan_members,
)
from flows.campaign_runners import Outcome, inprocess_runner, process_runner, run_members, run_night
from flows.campaign_tracking import is_done, log_report, parent_run, settle
from research_agent.analysis import MemberResult, Study, current, measure, study, write_report
from research_agent.campaign_stats import behind, halving
from research_agent.sweep import CampaignSpec, baseline_label, expand, match_config, rule_text

__all__ = ["campaign_flow", "compose_config", "member_overrides", "plan_members", "MemberPlan", "run_members",
           "Outcome", "schedule_kwargs", "deployment", "main"]

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


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
        status = o.status if o else ("done earlier" if r is not None and is_done(r) else "not run")
        style = {"FINISHED": "green", "FAILED": "red", "KILLED": "yellow", "SKIPPED": "yellow",
                 "STOPPED": "yellow"}.get(status, "dim")
        run_id = (o.run_id if o and o.run_id else r.run_id if r else "") or ""
        table.add_row(str(i), " ".join(p.member.overrides), f"[{style}]{status}[/]", _num(r.final if r else None),
                      _num(r.best if r else None), run_id[:12])
    return table


def _comparison_table(st: Study) -> Table:
    """The report's comparison with the baseline, for the terminal."""
    table = Table(title=f"against the baseline {st.baseline} ({st.metric}, {st.level:.0%} interval over seeds)",
                  title_justify="left")
    for col in ("configuration", "seeds", "mean", "diff", "interval", "verdict"):
        table.add_column(col, justify="right" if col in ("seeds", "mean", "diff") else "left")
    for r in st.rows:
        iv = r.interval
        style = {"better": "green", "worse": "red", "baseline": "bold"}.get(r.verdict, "yellow")
        table.add_row(r.config, str(r.seeds), _num(r.mean), f"{iv.diff:+.3f}" if iv else "–",
                      f"[{iv.lo:+.3f}, {iv.hi:+.3f}]" if iv else "–",
                      f"[{style}]{r.verdict}[/]")
    return table


def _study(spec: CampaignSpec, results: list[MemberResult], score: str) -> Study:
    """The night's comparison with the baseline and the answer to the campaign's decision rule."""
    d = spec.decision
    candidate = match_config(spec, d.adopt, "decision.adopt") if d else None
    return study(results, baseline_label(spec), score, spec.confidence, spec.question, rule_text(spec, score),
                 candidate, d.min_gain if d else 0.0)


def _decider(spec: CampaignSpec, parent_id: str, hashes: set[str],
             log: Any) -> Callable[[int, list[MemberPlan]], dict[str, str]]:
    """``decide(update, active)`` for :func:`run_night`: the stated early-stop rule on the members' values at
    that update (finished members of earlier nights included); returns {member key: why it stops}."""
    rule = spec.early_stop
    assert rule is not None
    base, swept = baseline_label(spec), list(spec.sweep.params)
    candidate = match_config(spec, spec.decision.adopt, "decision.adopt") if spec.decision else None

    def decide(update: int, active: list[MemberPlan]) -> dict[str, str]:
        m = measure(mlflow.get_tracking_uri(), parent_id, spec.metric, swept)
        at: dict[str, dict[int, float]] = {}
        for r in current(m.results, hashes)[0]:
            reached = any(s >= update for s, _ in [*r.curve, *r.scores])
            if r.state != "stopped" and reached and (v := r.score_at(update)) is not None:
                at.setdefault(r.config, {})[r.seed] = v
        stops = (halving({c: list(v.values()) for c, v in at.items()}, rule.keep, base, candidate)
                 if rule.rule == "halving"
                 else behind(at, base, spec.confidence))
        out = {p.member.key: f"{rule.rule} at update {update} of {p.updates} on {m.score}: {stops[p.member.config_label]}"
               for p in active if p.member.config_label in stops}
        for key, why in out.items():
            log.info("stopping member %s early: %s", key, why)
        return out

    return decide


@flow(name="swarm-campaign", validate_parameters=False, log_prints=True)
def campaign_flow(campaign: str, overrides: list[str] | None = None, scheduled: bool = False,
                  conf_dir: str | None = None) -> dict[str, Any]:
    """One night of campaign ``campaign`` (see the module docstring); ``conf_dir`` is searched before ``conf/``."""
    log = get_run_logger()
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)  # a log file gets whole rows
    conf = Path(conf_dir).resolve() if conf_dir else None
    user = [o for o in (overrides or []) if not o.lstrip("+~").startswith("campaign")]
    spec, mcfg, out = load_campaign(campaign, list(overrides or []), conf)
    mlflow.set_tracking_uri(tracking.tracking_uri(mcfg["tracking_uri"]))
    mlflow.set_experiment(experiment_id=tracking.ensure_experiment(mcfg["experiment"]))  # artifacts beside the DB
    parent_id, nights = parent_run(spec.name, mcfg["experiment"])
    if scheduled and nights >= spec.schedule.nights:
        log.info("campaign %s has run its %d nights; nothing to do", spec.name, spec.schedule.nights)
        return {"campaign": spec.name, "status": "complete", "parent_run_id": parent_id, "nights": nights}
    swept = list(spec.sweep.params)
    plans = plan_members(spec, expand(spec), user, out, conf)
    hashes = {p.hash for p in plans}
    uri = mlflow.get_tracking_uri()
    with mlflow.start_run(run_id=parent_id):
        mlflow.set_tag("swarm.nights", str(nights + 1))
        mlflow.log_dict(spec.model_dump(mode="json"), f"campaign/night-{nights + 1}.json")
        done = {r.member_hash for r in measure(uri, parent_id, spec.metric, swept).results if is_done(r) and r.member_hash}
        todo = [p for p in plans if p.hash not in done]
        console.print(f"[bold]campaign {spec.name}[/] night {nights + 1}: {len(plans)} members, "
                      f"{len(plans) - len(todo)} already done with this exact config, {len(todo)} to run "
                      f"(MLflow parent run {parent_id}; member folders and logs under {out / 'members'})")
        if spec.question:
            console.print(f"question: {spec.question}")
        make = process_runner if spec.concurrency > 1 else inprocess_runner
        runner = make(spec, user, conf, parent_id)
        position = {p.member.key: i for i, p in enumerate(todo, 1)}

        def announced(plan: MemberPlan, deadline: float | None, updates: int | None) -> Outcome:
            where = f" to update {updates}" if updates is not None else ""
            console.print(f"[bold cyan]member {position[plan.member.key]}/{len(todo)}[/]{where}: "
                          f"{' '.join(plan.member.overrides)}")
            return runner(plan, deadline, updates)

        def after(plan: MemberPlan, o: Outcome, final: bool) -> None:
            settle(plan, o, final, parent_id)
            if o.status == "FAILED":
                log.warning("member %s failed: %s", " ".join(plan.member.overrides), o.error)
            elif o.status == "STOPPED":
                console.print(f"[yellow]stopped early[/]: {' '.join(plan.member.overrides)}: {o.error}")

        stop = spec.early_stop
        outcomes = run_night(todo, announced, spec.concurrency, spec.budget_min * 60 if spec.budget_min else None,
                             stop.at if stop else None, _decider(spec, parent_id, hashes, log) if stop else None, after)
        m = measure(uri, parent_id, spec.metric, swept)
        results, older = current(m.results, hashes)
        st = _study(spec, results, m.score)
        notes = (f"{spec.description}\n\nNight {nights + 1} of {spec.schedule.nights}; parent MLflow run "
                 f"`{parent_id}`.")
        report, plots, rows = write_report(spec.name, results, swept, m.metric, out, notes, older=older, st=st)
        counts = {s: sum(o.status == s for o in outcomes) for s in ("FINISHED", "FAILED", "KILLED", "SKIPPED", "STOPPED")}
        log_report(st, out, nights + 1, counts)
        if rows and rows[0].final_mean is not None:
            mlflow.log_metric("campaign/best_final", rows[0].final_mean, step=nights + 1)
        console.print(_results_table(plans, results, outcomes, m.metric))
        console.print(_comparison_table(st))
        for line in st.stopped:
            console.print(f"stopped early: {line}")
        console.print(f"[bold]answer[/]: {st.answer.line}")
        console.print(f"report: {report}")
        proposal = _propose(spec, report, conf or CONF, log) if spec.plan.propose else None
    log.info("campaign %s night %d: %s; report %s", spec.name, nights + 1,
             ", ".join(f"{v} {k.lower()}" for k, v in counts.items() if v) or "nothing ran", report)
    return {"campaign": spec.name, "status": "ran", "parent_run_id": parent_id, "nights": nights + 1,
            "outcomes": [o.__dict__ for o in outcomes], "report": str(report), "plots": [str(p) for p in plots],
            "best": rows[0].config if rows else None, "answer": st.answer.line, "verdict": st.answer.verdict,
            "comparison": [r.as_dict() for r in st.rows], "proposal": str(proposal) if proposal else None}


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
