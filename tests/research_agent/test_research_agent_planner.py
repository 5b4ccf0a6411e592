"""The campaign planner with a scripted fake LLM: plan a campaign file (an invalid first answer is
sent back), propose the next night's revision from a report, apply it only on approval or --auto."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from research_agent.campaign import approve, main, plan_campaign, propose_next
from research_agent.errors import CampaignError
from research_agent.llm import ChatLLM
from research_agent.sweep import expand, parse_campaign

REPO = Path(__file__).resolve().parents[2]

PLAN_BAD = """```yaml
name: math_lora
base: ["+task=math", "train.updates=200"]
sweep: {mode: grid, params: {algo.lora.rnk: [8, 32]}, seeds: [0, 1, 2]}
schedule: {cron: "0 22 * * *", timezone: UTC, nights: 3}
```"""
PLAN_GOOD = PLAN_BAD.replace("rnk", "rank")
PROPOSAL = PLAN_GOOD.replace("[8, 32]", "[16, 32, 64]").replace("nights: 3", "nights: 2")


def planner_script(messages: list[dict]) -> str:
    assert messages[0]["content"].startswith("You plan")
    last = messages[-1]["content"]
    if "Last night's report" in last:
        assert "rank 32 beats 8" in last  # the report reached the LLM
        return PROPOSAL
    if "invalid" in last:
        assert "algo.lora.rnk" in last
        return PLAN_GOOD
    return PLAN_BAD


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "conf", tmp_path / "conf")
    return tmp_path / "conf"


def test_plan_then_propose_and_approve(fake_llm, conf: Path, tmp_path: Path) -> None:
    fake = fake_llm(planner_script)
    llm = ChatLLM(fake.settings())
    path = plan_campaign(llm, "compare LoRA ranks 8 and 32 on math over three nights", conf)
    assert path == conf / "campaign" / "math_lora.yaml" and len(fake.requests) == 2
    spec = parse_campaign(yaml.safe_load(path.read_text()))
    assert spec.sweep.params == {"algo.lora.rank": [8, 32]} and len(expand(spec)) == 6 and spec.schedule.nights == 3

    # a night ran: its report and analysis are in the campaign folder
    folder = tmp_path / "campaign_out"
    folder.mkdir()
    (folder / "report.md").write_text("# Campaign math_lora\n\nrank 32 beats 8: final 0.61 ± 0.02 vs 0.44 ± 0.05.\n")
    (folder / "analysis.json").write_text(json.dumps({"ranking": [{"config": "algo.lora.rank=32", "final_mean": 0.61}]}))
    before = path.read_text()
    prop = propose_next(llm, "math_lora", folder, conf)
    assert not prop.applied and path.read_text() == before  # nothing applied without approval
    assert prop.path == folder / "proposals" / "pending.yaml" and any(ln.startswith("+") and "- 64" in ln for ln in prop.diff.splitlines())
    assert prop.spec.sweep.params["algo.lora.rank"] == [16, 32, 64] and prop.spec.name == "math_lora"
    assert approve("math_lora", folder, conf) == path
    assert parse_campaign(yaml.safe_load(path.read_text())).schedule.nights == 2
    assert not (folder / "proposals" / "pending.yaml").exists()
    assert [p.name.split("-")[0] for p in sorted((folder / "proposals").glob("*.yaml"))] == ["proposal", "replaced"]
    with pytest.raises(CampaignError, match="no pending proposal"):
        approve("math_lora", folder, conf)

    # --auto applies at once; the CLI approves a pending one
    (path).write_text(before)
    assert propose_next(llm, "math_lora", folder, conf, auto=True).applied
    assert "64" in path.read_text()
    path.write_text(before)
    propose_next(llm, "math_lora", folder, conf)
    assert main(["--approve", "math_lora", "--conf-dir", str(conf)]) != 0  # its folder comes from the file's out_dir
    spec_text = yaml.safe_load(before)
    spec_text["out_dir"] = str(folder)
    path.write_text(yaml.safe_dump(spec_text))
    assert main(["--approve", "math_lora", "--conf-dir", str(conf)]) == 0 and "64" in path.read_text()
