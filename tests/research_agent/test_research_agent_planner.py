"""The campaign planner with a scripted fake LLM (a stand-in for the paid API): a plan states its question and
decision rule before any run (an invalid first answer, or one without a rule, is sent back); the next night's
proposal reads a real report (research_agent.analysis), is told what is unresolved and what lost, keeps the
rule as it resolves (a changed rule, a reordered sweep that moves an implicit baseline, a metric that ``auto``
would resolve otherwise are sent back), cites the answer; applied only on approval or --auto."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from research_agent.analysis import MemberResult, study, write_report
from research_agent.campaign import _keeps, approve, check_campaign, last_answer, main, plan_campaign, propose_next
from research_agent.errors import CampaignError
from research_agent.llm import ChatLLM
from research_agent.sweep import baseline_label, expand, parse_campaign

REPO = Path(__file__).resolve().parents[2]

RULE = """question: is LoRA rank 32 worth it over rank 8 on math?
baseline: {algo.lora.rank: 8}
decision: {adopt: {algo.lora.rank: 32}, min_gain: 0.03, rule: adopt rank 32 if held-out reward gains >= 3 points}
"""
PLAN_NO_RULE = """```yaml
name: math_lora
base: ["+task=math", "train.updates=200", "task.eval_every=4"]
sweep: {mode: grid, params: {algo.lora.rank: [8, 32]}, seeds: [0]}
schedule: {cron: "0 22 * * *", timezone: UTC, nights: 3}
```"""
PLAN_GOOD = PLAN_NO_RULE.replace("```yaml\n", "```yaml\n" + RULE)
PLAN_BAD = PLAN_GOOD.replace("algo.lora.rank: [8, 32]", "algo.lora.rnk: [8, 32]")


def _proposal(seeds: list[int], min_gain: float = 0.03) -> str:
    """The planner's next revision: more seeds (and, to be refused, another required gain)."""
    data = yaml.safe_load(PLAN_GOOD.strip("`").removeprefix("yaml\n"))
    data["sweep"]["seeds"], data["decision"]["min_gain"], data["schedule"]["nights"] = seeds, min_gain, 2
    data["notes"] = "more seeds for rank 32"
    return f"```yaml\n{yaml.safe_dump(data)}```"


def planner_script(messages: list[dict]) -> str:
    assert messages[0]["content"].startswith("You plan")
    last = messages[-1]["content"]
    if "Last night's answer: not resolved: algo.lora.rank=32 vs algo.lora.rank=8" in last:
        assert "- algo.lora.rank=32: not resolved (1 seed(s): an interval needs 2 or more) -> unresolved: add seeds" in last
        return _proposal([0, 1, 2], min_gain=0.01)  # moves the goalposts: sent back
    if "a proposal keeps min_gain as written before the runs" in last:
        return _proposal([0, 1, 2])
    if "invalid" in last:
        assert "algo.lora.rnk" in last
        return PLAN_GOOD
    return PLAN_BAD


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    return tmp_path / "conf"


def _night(folder: Path, spec_seeds: list[int]) -> str:
    """One night's real report: rank 8 and 32 on one seed each (unresolved), written by the analysis."""
    results = [MemberResult(f"r{k}{s}", f"m{k}{s}", f"algo.lora.rank={k}", {"algo.lora.rank": k}, s, "FINISHED",
                            [(1, v)]) for k, v in ((8, 0.44), (32, 0.61)) for s in spec_seeds]
    st = study(results, "algo.lora.rank=8", "eval/reward", question="is rank 32 worth it?",
               rule="adopt rank 32 if ...", candidate="algo.lora.rank=32", min_gain=0.03)
    write_report("math_lora", results, ["algo.lora.rank"], "eval/reward", folder, st=st)
    return st.answer.line


def test_plan_states_its_rule_then_propose_cites_the_answer_and_approve(fake_llm, conf: Path, tmp_path: Path) -> None:
    fake = fake_llm(planner_script)
    llm = ChatLLM(fake.settings())
    path = plan_campaign(llm, "compare LoRA ranks 8 and 32 on math over three nights", conf)
    assert path == conf / "campaign" / "math_lora.yaml" and len(fake.requests) == 2  # a bad key went back once
    spec = parse_campaign(yaml.safe_load(path.read_text()))
    assert spec.sweep.params == {"algo.lora.rank": [8, 32]} and len(expand(spec)) == 2 and spec.schedule.nights == 3
    assert spec.question and spec.decision is not None and spec.decision.min_gain == 0.03
    assert baseline_label(spec) == "algo.lora.rank=8"

    # a night ran: its report and analysis.json are in the campaign folder (one seed: not resolved)
    folder = tmp_path / "campaign_out"
    answer = _night(folder, [0])
    assert answer.startswith("not resolved: algo.lora.rank=32 vs algo.lora.rank=8")
    before = path.read_text()
    prop = propose_next(llm, "math_lora", folder, conf)
    assert len(fake.requests) == 4  # the proposal that changed min_gain went back once
    assert not prop.applied and path.read_text() == before  # nothing applied without approval
    assert prop.spec.sweep.seeds == [0, 1, 2] and prop.spec.decision == spec.decision  # seeds added, rule kept
    assert prop.spec.notes == f"Last night: {answer}\nThis revision: more seeds for rank 32"
    pending = prop.path.read_text()
    assert prop.path == folder / "proposals" / "pending.yaml" and f"# Last night's answer: {answer}" in pending
    assert any(ln.startswith("+") and "- 2" in ln for ln in prop.diff.splitlines())
    assert approve("math_lora", folder, conf) == path
    assert parse_campaign(yaml.safe_load(path.read_text())).schedule.nights == 2
    assert not (folder / "proposals" / "pending.yaml").exists()
    assert [p.name.split("-")[0] for p in sorted((folder / "proposals").glob("*.yaml"))] == ["proposal", "replaced"]
    with pytest.raises(CampaignError, match="no pending proposal"):
        approve("math_lora", folder, conf)

    # --auto applies at once; the CLI approves a pending one
    path.write_text(before)
    assert propose_next(llm, "math_lora", folder, conf, auto=True).applied
    assert parse_campaign(yaml.safe_load(path.read_text())).sweep.seeds == [0, 1, 2]
    path.write_text(before)
    propose_next(llm, "math_lora", folder, conf)
    assert main(["--approve", "math_lora", "--conf-dir", str(conf)]) != 0  # its folder comes from the file's out_dir
    spec_text = yaml.safe_load(before)
    spec_text["out_dir"] = str(folder)
    path.write_text(yaml.safe_dump(spec_text))
    assert main(["--approve", "math_lora", "--conf-dir", str(conf)]) == 0
    assert parse_campaign(yaml.safe_load(path.read_text())).sweep.seeds == [0, 1, 2]


def test_a_plan_without_a_rule_goes_back_and_one_that_never_states_it_fails(fake_llm, conf: Path) -> None:
    def script(messages: list[dict]) -> str:
        return PLAN_GOOD if "state the question and the decision rule" in messages[-1]["content"] else PLAN_NO_RULE

    fake = fake_llm(script)
    path = plan_campaign(ChatLLM(fake.settings()), "compare LoRA ranks", conf)
    assert len(fake.requests) == 2 and parse_campaign(yaml.safe_load(path.read_text())).decision is not None
    path.unlink()
    llm = ChatLLM(fake_llm(lambda messages: PLAN_NO_RULE).settings())
    with pytest.raises(CampaignError, match="no valid campaign after 2 answers: state the question and the decision"):
        plan_campaign(llm, "compare LoRA ranks", conf)
    assert not path.exists()


def test_the_frozen_rule_is_compared_as_it_resolves(conf: Path, tmp_path: Path) -> None:
    tiny = yaml.safe_load((REPO / "conf" / "campaign" / "tiny_lr.yaml").read_text())  # baseline: null, metric: auto
    current = parse_campaign(tiny)
    assert check_campaign(current, conf) == "reward/mean"  # no eval groups: auto is the training reward
    keeps = _keeps(current, conf)
    keeps(parse_campaign(tiny | {"sweep": {**tiny["sweep"], "seeds": [0, 1, 2]}}))  # more seeds: kept
    reordered = parse_campaign(tiny | {"sweep": {**tiny["sweep"], "params": {"algo.lr": [0.004, 0.001]}}})
    with pytest.raises(CampaignError, match="candidate is the baseline algo.lr=0.004 itself"):
        keeps(reordered)  # the implicit baseline would become the candidate
    three = {**tiny["sweep"], "params": {"algo.lr": [0.001, 0.002, 0.004]}}
    keeps3 = _keeps(parse_campaign(tiny | {"sweep": three}), conf)
    with pytest.raises(CampaignError, match=r"a proposal keeps baseline as written before the runs \(\{'baseline': "
                                            "'algo.lr=0.001'"):
        keeps3(parse_campaign(tiny | {"sweep": {**three, "params": {"algo.lr": [0.002, 0.001, 0.004]}}}))
    with pytest.raises(CampaignError, match="a proposal keeps metric as written"):
        keeps(parse_campaign(tiny | {"base": [*tiny["base"], "task.eval_every=2"]}))  # auto: reward -> eval
    implicit = parse_campaign(tiny | {"decision": {"adopt": {"algo.lr": 0.001}, "min_gain": 0.0}})
    with pytest.raises(CampaignError, match=r"decision.adopt \{'algo.lr': 0.001\}: the candidate is the baseline"):
        check_campaign(implicit, conf)


def test_the_planner_hears_a_halving_stop_as_unresolved_and_a_behind_stop_as_lost(tmp_path: Path) -> None:
    results = [MemberResult(f"r{c}{s}", f"m{c}{s}", f"algo.lora.rank={c}", {"algo.lora.rank": c}, s, "FINISHED",
                            [(1, 0.4 + 0.01 * s)]) for c in (8,) for s in range(2)]
    results += [MemberResult(f"r{c}{s}", f"m{c}{s}", f"algo.lora.rank={c}", {"algo.lora.rank": c}, s, "FAILED",
                             [(1, 0.1)], state="stopped", stopped=why) for s in range(2)
                for c, why in ((16, "halving at update 1 of 2: ranked 3 of 3"),
                               (32, "behind at update 1 of 2: behind the baseline: -0.300 [-0.4, -0.2]"))]
    write_report("m", results, ["algo.lora.rank"], "eval/reward", tmp_path, st=study(results, "algo.lora.rank=8",
                                                                                     "eval/reward"))
    _, per_config = last_answer(tmp_path)
    assert "- algo.lora.rank=16: stopped early (stopped early: halving" in per_config
    assert "ranked 3 of 3) -> stopped on rank, not shown worse: unresolved" in per_config
    assert "[-0.4, -0.2]) -> lost: drop it" in per_config
