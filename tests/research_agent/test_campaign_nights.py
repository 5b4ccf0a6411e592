"""Two nights of a campaign back to back on the tiny model, as its schedule runs them (the cron replaced by
calling the flow with the deployment's parameters at once), with the planner on a scripted fake LLM (a
stand-in for the paid API). Night 1 runs its members as processes and one is SIGKILLed after its first
update; the report says "not resolved" and the planner's applied proposal adds seeds, citing that answer.
Night 2 runs only the new members plus the killed one, which resumes from its checkpoint (same MLflow run,
no update trained twice), and the report resolves the decision written before the runs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import mlflow
import pytest
import yaml

from flows.campaign import campaign_flow, schedule_kwargs
from flows.campaign_members import load_campaign
from research_agent.sweep import expand, parse_campaign

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")]

CAMPAIGN = {
    "name": "tiny_nights",
    "description": "the word-chain warm-up against none before GRPO on echo, held-out eval reward",
    "question": "does the word_chain warm-up start echo RL better than no warm-up?",
    # groups of 2: twice the held-out instances of groups of 4 for the same episodes (an echo group shares one)
    "base": ["train.updates=3", "train.checkpoint_every=1", "batching.min_groups=1", "task.group_size=2",
             "task.eval_every=2"],
    "sweep": {"params": {"model.warmup": ["none", "word_chain"]}, "seeds": [0]},
    "baseline": {"model.warmup": "none"},
    "decision": {"adopt": {"model.warmup": "word_chain"}, "min_gain": 0.05},
    "schedule": {"nights": 2},
    "plan": {"propose": True, "auto": True},
}


# Four seeds, not three: t(0.975) falls from 4.30 to 3.18 and the half-width by a further sqrt(4/3), which the
# spread of word_chain members (a few tenths of the gain over none) needs for the interval to clear 0.
SEEDS = [0, 1, 2, 3]


def planner(messages: list[dict]) -> str:
    """The scripted planner: after an unresolved night, the same campaign with more seeds; else no change."""
    told = messages[-1]["content"].rsplit("\nLast night's answer: ", 1)[-1]  # the flow's summary of the report
    spec = dict(CAMPAIGN)
    spec["sweep"] = {**CAMPAIGN["sweep"], "seeds": SEEDS}
    if told.startswith("not resolved"):
        assert "-> no finished member yet: keep it" in told and "- model.warmup=none: baseline" in told
        spec["notes"] = "unresolved: seeds 1-3 for both warm-ups"
    else:
        spec["notes"] = "resolved: nothing to add"
    return f"```yaml\n{yaml.safe_dump(spec)}```"


def _kill_after_first_update(members: Path, key: str, uri: str, done: threading.Event, killed: list[str]) -> None:
    """SIGKILL the ``flows.train`` process of member ``key`` once its first update is checkpointed and logged."""
    client = mlflow.tracking.MlflowClient(uri)
    while not done.is_set():
        for latest in members.glob(f"{key}-*/checkpoints/default/LATEST"):
            folder = latest.parents[2]
            run_id = json.loads((folder / "mlflow_run.json").read_text())["run_id"]
            if not client.get_metric_history(run_id, "reward/mean"):
                continue  # checkpointed, not logged yet: a kill now would lose update 1's MLflow row
            mark = f"train.out_dir={folder}".encode()
            for proc in Path("/proc").iterdir():
                try:
                    cmd = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
                except OSError:
                    continue
                if b"flows.train" in cmd and mark in cmd.split(b"\0"):
                    os.kill(int(proc.name), signal.SIGKILL)
                    killed.append(latest.read_text())
                    return
        time.sleep(0.05)


@pytest.mark.usefixtures("prefect_harness")
def test_two_nights_resolve_with_seeds_added_by_the_planner_and_a_crashed_member_resumes(
        fake_llm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_llm(planner)
    for k, v in (("OPENAI_BASE_URL", fake.url), ("OPENAI_API_KEY", "test-key"), ("RESEARCH_AGENT_MODEL", "fake")):
        monkeypatch.setenv(k, v)
    conf = tmp_path / "conf"
    shutil.copytree(REPO / "conf", conf)
    (conf / "campaign" / "tiny_nights.yaml").write_text(yaml.safe_dump(CAMPAIGN))
    out, uri = tmp_path / "campaign", f"sqlite:///{tmp_path / 'mlruns.db'}"
    overrides = [f"mlflow.tracking_uri={uri}", f"campaign.out_dir={out}", "mlflow.sample_trajectories=0"]
    spec, _, _ = load_campaign("tiny_nights", overrides, conf)
    night = schedule_kwargs(spec, overrides, str(conf))["parameters"]  # what each scheduled night is given
    assert night["scheduled"] is True
    base0, cand0 = expand(spec)  # (none, seed 0), (word_chain, seed 0)

    # night 1: members side by side as processes; word_chain seed 0 is killed after its first checkpoint
    done, killed = threading.Event(), []
    watcher = threading.Thread(target=_kill_after_first_update, args=(out / "members", cand0.key, uri, done, killed))
    watcher.start()
    try:
        first = campaign_flow(**night | {"overrides": [*overrides, "campaign.concurrency=2"]})
    finally:
        done.set()
        watcher.join()
    assert killed and killed[0] != "ckpt-00000003", "the member finished before it could be killed"
    status = {o["key"]: o for o in first["outcomes"]}
    assert status[base0.key]["status"] == "FINISHED" and status[cand0.key]["status"] == "FAILED"
    assert "exited with -9" in status[cand0.key]["error"]
    assert first["verdict"] == "not resolved"
    assert first["answer"] == "not resolved: model.warmup=word_chain has no finished member yet; run it"
    assert f"**Answer**: {first['answer']}" in (out / "report.md").read_text()
    applied = parse_campaign(yaml.safe_load((conf / "campaign" / "tiny_nights.yaml").read_text()))
    assert applied.sweep.seeds == SEEDS and applied.decision == spec.decision  # seeds added, the rule kept
    assert applied.notes == f"Last night: {first['answer']}\nThis revision: unresolved: seeds 1-3 for both warm-ups"

    # night 2 (in this process): only the six new members and the killed one, which resumes
    t2 = time.time() * 1000
    second = campaign_flow(**night | {"overrides": [*overrides, "campaign.concurrency=1"]})
    new = {m.key for m in expand(applied)} - {base0.key, cand0.key}
    assert {o["key"] for o in second["outcomes"]} == new | {cand0.key} and len(new) == 6
    assert all(o["status"] == "FINISHED" for o in second["outcomes"])
    client = mlflow.tracking.MlflowClient(uri)
    resumed = next(o for o in second["outcomes"] if o["key"] == cand0.key)
    assert resumed["run_id"] == status[cand0.key]["run_id"]  # the same MLflow run, continued
    run = client.get_run(resumed["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["swarm.member_state"] == "complete"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert sorted({m.step for m in history}) == [1, 2, 3]
    resumed_at = int(killed[0].rsplit("-", 1)[-1])  # the last checkpoint before the kill: 1, or 2 if it got there
    assert all((m.timestamp < t2) == (m.step <= resumed_at) for m in history)  # nothing trained again, none lost
    assert second["verdict"] == "adopt", second["answer"]
    assert second["answer"].startswith("adopt model.warmup=word_chain: model.warmup=word_chain vs model.warmup=none")
    assert "over 4 seeds (paired)" in second["answer"]
    parent = client.get_run(second["parent_run_id"])
    assert parent.data.tags["swarm.answer"] == second["answer"] and parent.data.tags["swarm.nights"] == "2"
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/comparison.json", "report/report.md", "report/plots"} <= arts
    assert len(fake.requests) == 2  # one proposal per night
    # a third scheduled night does nothing: the campaign ran its two nights
    assert campaign_flow(**night)["status"] == "complete"
