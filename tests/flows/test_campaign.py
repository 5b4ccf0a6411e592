"""Campaigns: a two-member sweep end to end (nested MLflow runs, report with plots, next night
continues), members identified by their effective-config hash (a changed config reruns), a task kept
outside the repository (``--config-dir``), failing members, the cron deployment, and early stops: members
pause at each checkpoint, the stated rule stops some and says so, the rest resume and finish."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from pathlib import Path
from zoneinfo import ZoneInfo

import mlflow
import pytest
import yaml

from flows.campaign import Outcome, campaign_flow, deployment, main, member_overrides, plan_members, run_members
from flows.campaign_members import MemberPlan
from flows.campaign_runners import progress, run_night
from flows.campaign_tracking import is_done
from research_agent.analysis import MemberResult
from research_agent.sweep import Member, config_hash, expand, parse_campaign

REPO = Path(__file__).resolve().parents[2]


def _overrides(tmp_path: Path) -> list[str]:
    return [f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlruns.db'}", f"campaign.out_dir={tmp_path / 'campaign'}",
            "mlflow.sample_trajectories=0"]


def test_expand_grid_random_and_overrides(tmp_path: Path) -> None:
    spec = parse_campaign({"name": "c", "base": ["+task=echo"],
                           "sweep": {"params": {"algo.lr": [0.001, 0.003], "algo.lora.rank": [8, 32]}, "seeds": [0, 1]}})
    members = expand(spec)
    assert len(members) == 8 and len({m.key for m in members}) == 8
    assert members[0].overrides == ("algo.lr=0.001", "algo.lora.rank=8", "seed=0")
    rnd = parse_campaign({"name": "r", "sweep": {"mode": "random", "samples": 3, "seeds": [0],
                                                 "params": {"algo.lr": {"low": 1e-4, "high": 1e-2, "log": True}}}})
    assert [m.key for m in expand(rnd)] == [m.key for m in expand(rnd)]  # same draws every night
    assert all(1e-4 <= m.values["algo.lr"] <= 1e-2 for m in expand(rnd))
    ov = member_overrides(spec, members[0], ["model.seed=1"], tmp_path / "m")
    assert ov[0] == "+task=echo" and "model.seed=1" in ov and f"train.out_dir={tmp_path / 'm'}" in ov
    with pytest.raises(Exception, match="sweep.params.algo.lr: a range needs sweep.mode=random"):
        parse_campaign({"name": "x", "sweep": {"params": {"algo.lr": {"low": 0.1, "high": 1}}}})


def test_member_identity_is_the_effective_config_hash(tmp_path: Path) -> None:
    spec = parse_campaign({"name": "c", "base": ["train.updates=2"],
                           "sweep": {"params": {"algo.lr": [0.001, 0.004]}, "seeds": [0]}})
    members = expand(spec)
    plans = plan_members(spec, members, [f"mlflow.tracking_uri=sqlite:///{tmp_path / 'a.db'}"], tmp_path / "a")
    assert plans[0].hash != plans[1].hash  # the swept value is part of the config
    assert plans[0].run_name == "echo lr=0.001 seed=0"
    assert plans[0].tags | {"swarm.member_hash": ""} == {"swarm.task": "echo", "swarm.model": "tiny", "swarm.campaign": "c",
                                                          "swarm.kind": "member", "swarm.member_hash": ""}
    assert plans[0].folder == tmp_path / "a" / "members" / f"{members[0].key}-{plans[0].hash[:8]}"
    # where it writes and which MLflow store it uses are not the member's identity ...
    moved = plan_members(spec, members, [f"mlflow.tracking_uri=sqlite:///{tmp_path / 'b.db'}"], tmp_path / "b")
    assert [p.hash for p in moved] == [p.hash for p in plans]
    # ... but the number of updates, a user override or the base config are
    longer = parse_campaign(spec.model_dump() | {"base": ["train.updates=3"]})
    assert {p.hash for p in plan_members(longer, members, [], tmp_path)}.isdisjoint({p.hash for p in plans})
    assert plan_members(spec, members, ["task.max_tokens=4"], tmp_path)[0].hash != plans[0].hash
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "train.yaml").write_text((REPO / "conf" / "train.yaml").read_text().replace("max_tokens: 8", "max_tokens: 6"))
    assert plan_members(spec, members, [], tmp_path, conf)[0].hash != plans[0].hash
    assert config_hash({"a": 1, "mlflow": {"x": 1}, "gateway": {"port": 5}}) == config_hash({"a": 1, "gateway": {}})


def test_cli_config_dir_lists_its_campaigns_and_rejects_a_missing_folder(tmp_path: Path) -> None:
    (tmp_path / "campaign").mkdir()
    (tmp_path / "campaign" / "mine.yaml").write_text("name: mine\n")
    with pytest.raises(SystemExit, match=r"--config-dir DIR.*\ncampaigns: .*mine.*tiny_lr"):
        main(["--config-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match="not a folder"):
        main([f"--config-dir={tmp_path / 'nope'}", "+campaign=mine"])


def test_failed_members_do_not_stop_the_rest_and_budget_skips() -> None:
    members = [Member({"x": i}, 0) for i in range(4)]
    now = [0.0]

    def run_one(m: Member, deadline: float | None) -> Outcome:
        now[0] += 10
        if m.values["x"] == 1:
            raise RuntimeError("boom")
        return Outcome(m.key, "FINISHED")

    out = run_members(members, run_one, budget_s=25, clock=lambda: now[0])
    assert [o.status for o in out] == ["FINISHED", "FAILED", "FINISHED", "SKIPPED"]
    assert "boom" in out[1].error


def test_a_night_pauses_members_at_checkpoints_stops_some_and_finishes_the_rest(tmp_path: Path) -> None:
    plans = [MemberPlan(Member({"x": i}, 0), f"h{i}", tmp_path / f"m{i}", f"m{i}", {}, updates=4) for i in range(4)]
    ran: list[tuple[int, int | None]] = []
    heard: list[tuple[int, str, bool]] = []

    def segment(p: MemberPlan, deadline: float | None, updates: int | None) -> Outcome:
        ran.append((p.member.values["x"], updates))
        if p.member.values["x"] == 3 and updates is None:
            raise RuntimeError("boom")  # a crash on the way to the end
        return Outcome(p.member.key, "FINISHED", run_id=f"run{p.member.values['x']}")

    def decide(update: int, active: list[MemberPlan]) -> dict[str, str]:
        # member 2 resumed past update 2: it was judged there on its own night, not again tonight
        assert update == 2 and [p.member.values["x"] for p in active] == [0, 1, 3]
        return {plans[1].member.key: "behind"}

    out = run_night(plans, segment, checkpoints=[2, 9], decide=decide,
                    after=lambda p, o, final: heard.append((p.member.values["x"], o.status, final)),
                    where=lambda p: 3 if p.member.values["x"] == 2 else 0)  # member 2 resumes past update 2
    assert [(o.status, o.run_id) for o in out] == [("FINISHED", "run0"), ("STOPPED", "run1"), ("FINISHED", "run2"),
                                                   ("FAILED", "run3")]
    assert out[1].error == "behind" and "boom" in out[3].error
    assert ran == [(0, 2), (1, 2), (3, 2), (0, None), (2, None), (3, None)]  # 9 is past train.updates: no pause
    assert (1, "STOPPED", True) in heard and (0, "FINISHED", False) in heard and (0, "FINISHED", True) in heard
    folder = tmp_path / "m0" / "checkpoints"
    for policy, ckpt in (("a", "ckpt-00000004"), ("b", "ckpt-00000002")):
        (folder / policy).mkdir(parents=True)
        (folder / policy / "LATEST").write_text(ckpt)
    assert progress(tmp_path / "m0") == 2 and progress(tmp_path / "m1") == 0


def test_a_stopped_member_is_done_whatever_its_run_status() -> None:
    def r(status: str, state: str) -> MemberResult:
        return MemberResult("r", "k", "c", {}, 0, status, state=state)

    # crashed past a checkpoint (FAILED), then stopped there: done, so no later night reruns and re-judges it
    assert is_done(r("FAILED", "stopped")) and is_done(r("KILLED", "stopped")) and is_done(r("FINISHED", "stopped"))
    assert is_done(r("FINISHED", "complete")) and is_done(r("FINISHED", ""))
    assert not is_done(r("FAILED", "partial")) and not is_done(r("FINISHED", "partial"))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_halving_stops_the_member_behind_at_its_checkpoint_and_the_rest_resume(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    (conf / "campaign" / "tiny_stop.yaml").write_text(yaml.safe_dump({
        "name": "tiny_stop", "base": ["train.updates=2", "train.checkpoint_every=1", "batching.min_groups=1",
                                      "task.group_size=4", "task.eval_every=2"],
        "sweep": {"params": {"model.warmup": ["word_chain", "none"]}, "seeds": [0]},
        "early_stop": {"rule": "halving", "at": [1], "keep": 0.5}}))
    res = campaign_flow("tiny_stop", _overrides(tmp_path), conf_dir=str(conf))
    assert [(o["status"], o["error"][:24]) for o in res["outcomes"]] == [
        ("FINISHED", ""), ("STOPPED", "halving at update 1 of 2")]
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    kept, stopped = (client.get_run(o["run_id"]) for o in res["outcomes"])
    assert stopped.data.tags["swarm.member_state"] == "stopped" and "ranked 2 of 2" in stopped.data.tags["swarm.stopped"]
    assert [m.step for m in client.get_metric_history(stopped.info.run_id, "reward/mean")] == [1]  # no budget spent
    # the kept member paused at update 1 and resumed from that checkpoint: one run, one history, steps 1 and 2
    assert kept.data.tags["swarm.member_state"] == "complete"
    assert [m.step for m in client.get_metric_history(kept.info.run_id, "reward/mean")] == [1, 2]
    assert any(a.path.startswith("config-resumed-") for a in client.list_artifacts(kept.info.run_id))
    report = (tmp_path / "campaign" / "report.md").read_text()
    assert "## Stopped early" in report and "- `model.warmup=none` seed 0: halving at update 1 of 2" in report
    assert "| `model.warmup=none` | 0 | – | – | – | stopped early (see below) |" in report
    # a halving stop is a rank after one seed and one update, not a loss: nothing is resolved
    assert res["answer"].startswith("not resolved (no decision rule stated): vs model.warmup=word_chain on "
                                    "eval/reward (last 64 eval episodes): model.warmup=none stopped early")
    # stopped is done: the next night runs nothing
    assert campaign_flow("tiny_stop", _overrides(tmp_path), conf_dir=str(conf))["outcomes"] == []


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_two_member_campaign_end_to_end(tmp_path: Path) -> None:
    overrides = _overrides(tmp_path) + ["campaign.base=['train.updates=2','batching.min_groups=1','task.group_size=4']"]
    res = campaign_flow("tiny_lr", overrides)
    assert [o["status"] for o in res["outcomes"]] == ["FINISHED", "FINISHED"]
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    client = mlflow.tracking.MlflowClient(uri)
    parent = client.get_run(res["parent_run_id"])
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 2 and all(c.info.status == "FINISHED" for c in children)
    assert {c.data.params["algo.lr"] for c in children} == {"0.001", "0.004"}
    assert all(c.data.params["campaign_member.campaign"] == "tiny_lr" for c in children)
    assert {c.info.run_name for c in children} == {"echo lr=0.001 seed=0", "echo lr=0.004 seed=0"}
    assert all(c.data.tags["swarm.task"] == "echo" and c.data.tags["swarm.model"] == "tiny"
               and c.data.tags["swarm.campaign"] == "tiny_lr" and len(c.data.tags["swarm.member_hash"]) == 64
               for c in children)
    out = tmp_path / "campaign"
    report = (out / "report.md").read_text()
    assert "| 1 | `algo.lr=" in report and "![curves](plots/curves.png)" in report
    assert (out / "plots" / "curves.png").stat().st_size > 1000 and (out / "plots" / "vs_algo.lr.png").exists()
    ranking = json.loads((out / "analysis.json").read_text())["ranking"]
    assert len(ranking) == 2 and all(r["final_mean"] is not None for r in ranking)
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/analysis.json", "report/plots"} <= arts
    # the next night continues from MLflow: both members are done, nothing reruns, same parent run
    again = campaign_flow("tiny_lr", overrides, scheduled=True)
    assert again["parent_run_id"] == res["parent_run_id"] and again["outcomes"] == [] and again["nights"] == 2
    assert "1 | `algo.lr=" in (tmp_path / "campaign" / "report.md").read_text()  # the same members reported
    # a member that fails (bad warm-up name) is marked FAILED in MLflow; the campaign finishes its night
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    (conf / "campaign" / "tiny_bad.yaml").write_text(yaml.safe_dump(
        {"name": "tiny_bad", "base": ["train.updates=1"], "sweep": {"params": {"model.warmup": ["bogus"]}}}))
    third = campaign_flow("tiny_bad", _overrides(tmp_path), conf_dir=str(conf))
    assert [o["status"] for o in third["outcomes"]] == ["FAILED"]
    failed = client.get_run(third["outcomes"][0]["run_id"])
    assert failed.info.status == "FAILED" and "warmup" in failed.data.tags["swarm.error"]
    assert failed.data.tags["mlflow.parentRunId"] == third["parent_run_id"] != res["parent_run_id"]
    assert "## Failed members" in (out / "report.md").read_text()


@pytest.mark.usefixtures("prefect_harness")
def test_schedule_is_a_cron_deployment_with_the_right_next_run(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    dep = deployment("tiny_lr", _overrides(tmp_path))
    dep_id = dep.apply(_sync=True)
    with get_client(sync_client=True) as client:
        d = client.read_deployment(dep_id)
        assert d.name == "tiny_lr" and d.parameters["scheduled"] is True
        sched = d.schedules[0].schedule
        assert sched.cron == "0 22 * * *" and sched.timezone == "UTC" and d.schedules[0].active
        resp = client._client.post(f"/deployments/{dep_id}/schedule", json={"max_runs": 3})  # the scheduler's job
        resp.raise_for_status()
        mine = DeploymentFilter(id=DeploymentFilterId(any_=[dep_id]))  # other tests' flow runs share the server
        runs = client.read_flow_runs(deployment_filter=mine, limit=10)
    starts = sorted(r.expected_start_time for r in runs if r.deployment_id == dep_id)
    now = dt.datetime.now(ZoneInfo("UTC"))
    first = now.replace(hour=22, minute=0, second=0, microsecond=0)
    if first <= now:
        first += dt.timedelta(days=1)
    assert starts[:3] == [first, first + dt.timedelta(days=1), first + dt.timedelta(days=2)]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_config_dir_task_outside_the_repo_and_a_changed_config_reruns(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # a generated task kept outside the repository: its package, task config and campaign in tmp_path
    pkg = tmp_path / "mytasks" / "mytask"
    pkg.mkdir(parents=True)
    (tmp_path / "mytasks" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from experiments.echo import make_instance, run_episode  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    conf = tmp_path / "conf"
    (conf / "task").mkdir(parents=True)
    (conf / "campaign").mkdir()
    (conf / "task" / "mytask.yaml").write_text("# @package _global_\ntask:\n  name: mytasks.mytask\n  group_size: 4\n")
    (conf / "campaign" / "ext.yaml").write_text(yaml.safe_dump(
        {"name": "ext", "base": ["+task=mytask", "batching.min_groups=1"], "sweep": {"params": {"algo.lr": [0.002]}}}))
    overrides = _overrides(tmp_path)
    first = campaign_flow("ext", [*overrides, "train.updates=1"], conf_dir=str(conf))
    assert [o["status"] for o in first["outcomes"]] == ["FINISHED"]
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlruns.db'}")
    run = client.get_run(first["outcomes"][0]["run_id"])
    assert run.info.run_name == "mytask lr=0.002 seed=0" and run.data.tags["swarm.task"] == "mytasks.mytask"
    # more updates: the same swept values, another member; it reruns and the report shows only the new run
    second = campaign_flow("ext", [*overrides, "train.updates=2"], conf_dir=str(conf))
    assert [o["status"] for o in second["outcomes"]] == ["FINISHED"]
    rerun = client.get_run(second["outcomes"][0]["run_id"])
    assert rerun.info.run_id != run.info.run_id
    assert rerun.data.tags["swarm.member_hash"] != run.data.tags["swarm.member_hash"]
    assert [m.step for m in client.get_metric_history(rerun.info.run_id, "reward/mean")][-1] == 2
    report = (tmp_path / "campaign" / "report.md").read_text()
    assert "1 member runs (1 finished" in report and "1 older member run(s)" in report
    # unchanged: nothing reruns
    third = campaign_flow("ext", [*overrides, "train.updates=2"], conf_dir=str(conf))
    assert third["outcomes"] == [] and third["nights"] == 3


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "conf" / "campaign").glob("*.yaml")))
def test_every_shipped_campaign_composes(name: str) -> None:
    """Each campaign file in conf/campaign loads, and every member's config composes with its decision rule."""
    from research_agent.campaign import CONF_DIR, check_campaign, load_campaign_file

    spec = load_campaign_file(name)
    assert spec.name == name and expand(spec)
    assert check_campaign(spec, CONF_DIR) in ("held-out eval", "reward/mean") or spec.metric != "auto"
