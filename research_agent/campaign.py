"""The campaign planner (LLM): ``python -m research_agent.campaign "<what to compare>"``.

- plan: a description becomes ``conf/campaign/<name>.yaml``; the LLM's YAML is validated
  (:func:`research_agent.sweep.parse_campaign`, then every member's overrides are composed with
  Hydra against ``conf/train.yaml``) and sent back once with the error when invalid. ``--schedule``
  then serves it (``python -m flows.campaign +campaign=<name> --schedule``).
  A plan states its question and decision rule (``question``, ``decision``) before any run; a plan
  without them is sent back.
- propose (``--propose <name>``, also called by ``flows.campaign`` after each night with
  ``plan.propose``): reads the night's ``report.md`` / ``analysis.json`` and proposes a revised
  campaign file (same name, so the next night continues the same parent MLflow run and skips
  finished members), told which comparisons are unresolved (add seeds) and which lost (drop them).
  The proposal keeps the question, the decision rule, the baseline and the metric as written before
  the runs (one that changes them is sent back) and cites last night's answer (its ``notes`` and
  header). It is saved as ``<campaign dir>/proposals/pending.yaml`` and applied only with ``--auto``
  or the researcher's approval (``--approve <name>``, or answering y).

It does not run members or analyse results (``flows.campaign`` / :mod:`research_agent.analysis`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from research_agent.campaign_stats import stopped_behind
from research_agent.errors import CampaignError, LLMError, ResearchAgentError
from research_agent.llm import CONF_DIR, ChatLLM, load_agent_config, load_settings
from research_agent.sweep import CampaignSpec, baseline_label, campaign_dir, expand, match_config, parse_campaign

__all__ = ["plan_campaign", "propose_next", "approve", "Proposal", "check_campaign", "load_campaign_file", "main",
           "last_answer", "FROZEN"]

PLAN_SYSTEM = """You plan training campaigns for swarmpool (RL for LLM agents). A campaign file is YAML:
name: <identifier>
description: <one line>
question: <what the campaign should find out, one sentence>
base: [Hydra overrides of conf/train.yaml every member gets, e.g. "+task=math", "train.updates=200"]
sweep: {mode: grid|random, params: {<override key>: [values]}, seeds: [0, 1, 2]}
baseline: {<swept key>: <value>}      # the configuration every other one is compared with
decision: {adopt: {<swept key>: <value>}, min_gain: <in the metric's units>, rule: "<the rule in words>"}
confidence: 0.95
early_stop: null | {rule: halving|behind, at: [<update>], keep: 0.5}
concurrency: 1
budget_min: <minutes per night>
metric: auto                          # held-out eval metric where the task runs eval groups (task.eval_every)
schedule: {cron: "0 22 * * *", timezone: UTC, nights: <n>}
plan: {propose: true, auto: false}
notes: <why this revision; in a proposal, cite last night's answer>
State the question and the decision rule before any run: "adopt X if <metric> gains >= g over the baseline
with the 95% interval above 0" (the report answers it in one line). Several seeds per configuration: the
report compares over seeds, paired by seed. Set task.eval_every in base (e.g. 4) so the held-out eval metric
decides, not the training reward.
Keys of conf/train.yaml you may sweep or set: seed, task.group_size, task.temperature, task.max_tokens,
task.eval_every, train.updates, train.max_staleness, algo.lr, algo.kl_coef, algo.clip_low, algo.clip_high,
algo.lora.rank, algo.lora.alpha, algo.scale_std, batching.min_groups, model.warmup (tiny model). Tasks: {tasks}.
Answer with the YAML only, in a ```yaml block."""

# What a proposal keeps as the campaign file had it: decided before the runs, not after seeing them. The
# baseline, the candidate and the metric are compared as they resolve (:func:`_frozen`), not as written.
FROZEN = ("question", "decision", "baseline", "metric", "confidence")


def _tasks(conf_dir: Path) -> str:
    return ", ".join(sorted(p.stem for p in (conf_dir / "task").glob("*.yaml"))) or "echo"


def extract_yaml(text: str) -> dict[str, Any]:
    m = re.search(r"```(?:ya?ml)?\s*\n(.*?)```", text, re.S)
    try:
        data = yaml.safe_load(m.group(1) if m else text)
    except yaml.YAMLError as exc:
        raise LLMError(f"the answer is not YAML: {exc}", raw=text) from exc
    if not isinstance(data, dict):
        raise LLMError("the answer holds no YAML mapping", raw=text)
    return data


def check_campaign(spec: CampaignSpec, conf_dir: Path) -> str:
    """Compose every member's config with Hydra; a bad key or task, or a candidate that is the baseline (named
    or the implicit first configuration), is a CampaignError naming it. Returns the metric the comparison
    resolves to: ``metric`` as written, or for ``auto`` "held-out eval" where a member runs eval groups
    (``task.eval_every``), else ``reward/mean``."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    base = baseline_label(spec)  # the baseline names one configuration
    if spec.decision is not None and match_config(spec, spec.decision.adopt, "decision.adopt") == base:
        raise CampaignError(f"decision.adopt {spec.decision.adopt}: the candidate is the baseline {base} itself "
                            "(with baseline: null the first configuration is the baseline); name another "
                            "configuration or set baseline")
    held_out = False
    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base=None):
        for m in expand(spec):
            try:
                cfg = compose(config_name="train", overrides=[*spec.base, *m.overrides, "train.out_dir=."])
            except (HydraException, OmegaConfBaseException) as exc:
                raise CampaignError(f"member {m.label}: overrides {[*spec.base, *m.overrides]} do not compose: "
                                    f"{exc}") from exc
            held_out = held_out or bool(cfg.task.get("eval_every", 0))
    if spec.metric != "auto":
        return spec.metric
    return "held-out eval" if held_out else "reward/mean"


def _frozen(spec: CampaignSpec, metric: str) -> dict[str, Any]:
    """What the rule decided before the runs, as it resolves: the baseline's and candidate's labels (a reordered
    sweep can move an implicit baseline), the metric ``auto`` resolves to, and the rest as written."""
    d = spec.decision
    return {"question": spec.question, "baseline": baseline_label(spec),
            "candidate": match_config(spec, d.adopt, "decision.adopt") if d else None,
            "min_gain": d.min_gain if d else None, "rule": d.rule if d else None, "metric": metric,
            "confidence": spec.confidence}


def _require_rule(spec: CampaignSpec) -> None:
    if not spec.question or spec.decision is None:
        raise CampaignError("state the question and the decision rule before any run: question: <one sentence>, "
                            "decision: {adopt: {<swept key>: <value>}, min_gain: <gain>, rule: <in words>}")


def _keeps(current: CampaignSpec, conf_dir: Path) -> Any:
    """A check that a proposal keeps what ``current`` decided before the runs (:data:`FROZEN`, as resolved)."""
    before = _frozen(current, check_campaign(current, conf_dir))

    def check(spec: CampaignSpec) -> None:
        now = _frozen(spec, check_campaign(spec, conf_dir))
        changed = [k for k in before if now[k] != before[k]]
        if changed and (current.question or current.decision is not None):
            was = {k: before[k] for k in changed}
            raise CampaignError(f"a proposal keeps {', '.join(changed)} as written before the runs ({was}): a rule "
                                "changed after seeing the results decides nothing; change seeds, configurations, "
                                "updates or the schedule only")
    return check


def _ask(llm: ChatLLM, messages: list[dict[str, str]], conf_dir: Path, stage: str, name: str | None,
         extra: Any = None) -> CampaignSpec:
    err: Exception | None = None
    for _ in range(2):
        answer = llm.complete(messages, stage=stage)
        try:
            data = extract_yaml(answer)
            if name:
                data["name"] = name
            spec = parse_campaign(data)
            if extra is not None:
                extra(spec)
            check_campaign(spec, conf_dir)
            return spec
        except (LLMError, CampaignError) as exc:
            err = exc
            messages = messages + [{"role": "assistant", "content": answer},
                                   {"role": "user", "content": f"That campaign is invalid: {exc}. Answer with the "
                                                               "corrected YAML only."}]
    raise CampaignError(f"no valid campaign after 2 answers: {err}")


def _dump(spec: CampaignSpec, header: str) -> str:
    data = spec.model_dump(mode="json", exclude_none=False)
    return f"# {header}\n" + yaml.safe_dump(data, sort_keys=False)


def load_campaign_file(name: str, conf_dir: Path | str = CONF_DIR) -> CampaignSpec:
    path = Path(conf_dir) / "campaign" / f"{name}.yaml"
    if not path.exists():
        raise CampaignError(f"{path} does not exist")
    return parse_campaign(yaml.safe_load(path.read_text()) or {})


def plan_campaign(llm: ChatLLM, description: str, conf_dir: Path | str = CONF_DIR, name: str | None = None) -> Path:
    """Write ``conf/campaign/<name>.yaml`` for ``description``; returns its path."""
    conf_dir = Path(conf_dir)
    messages = [{"role": "system", "content": PLAN_SYSTEM.replace("{tasks}", _tasks(conf_dir))},
                {"role": "user", "content": description}]
    spec = _ask(llm, messages, conf_dir, "plan", name, _require_rule)
    if not spec.description:
        spec = spec.model_copy(update={"description": description})
    path = conf_dir / "campaign" / f"{spec.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dump(spec, f"Planned by the research agent from: {description}"))
    return path


@dataclass
class Proposal:
    path: Path          # <campaign dir>/proposals/pending.yaml (or the applied conf file)
    spec: CampaignSpec
    diff: str
    applied: bool = False


def last_answer(folder: Path) -> tuple[str, str]:
    """Last night's one-line answer and, per configuration, what to do with it (from ``analysis.json``)."""
    f = folder / "analysis.json"
    comp = (json.loads(f.read_text()).get("comparison") or {}) if f.exists() else {}
    if not comp:
        return "", ""
    todo = {"not resolved": "unresolved: add seeds", "worse": "lost: drop it", "stopped early": "lost: drop it",
            "better": "resolved better: keep it", "no result": "no finished member yet: keep it",
            "baseline": "the baseline: keep it"}
    def what(r: dict[str, Any]) -> str:  # a halving stop is a rank, not a loss: only "behind" showed it worse
        if r["verdict"] == "stopped early" and not stopped_behind(r.get("note") or ""):
            return "stopped on rank, not shown worse: unresolved"
        return todo.get(r["verdict"], "keep")

    lines = [f"- {r['config']}: {r['verdict']} ({r.get('note') or 'n=' + str(r['seeds'])}) -> {what(r)}"
             for r in comp.get("rows", [])]
    return comp["answer"]["line"], "\n".join(lines)


def _cite(spec: CampaignSpec, answer: str) -> CampaignSpec:
    """The proposal's notes, citing last night's answer before the planner's own reason."""
    own = spec.notes.split("This revision:", 1)[-1].strip() if "This revision:" in spec.notes else spec.notes.strip()
    return spec.model_copy(update={"notes": f"Last night: {answer}\nThis revision: {own or '(no reason given)'}"})


def propose_next(llm: ChatLLM, name: str, folder: Path | None = None, conf_dir: Path | str = CONF_DIR,
                 auto: bool = False) -> Proposal:
    """Read the campaign's report and propose its next revision, citing last night's answer (seeds added where
    unresolved, losers dropped); the question and decision rule stay; apply it only with ``auto``."""
    conf_dir = Path(conf_dir)
    current = load_campaign_file(name, conf_dir)
    folder = Path(folder) if folder else campaign_dir(current)
    report = folder / "report.md"
    if not report.exists():
        raise CampaignError(f"{report} does not exist: run a night first (python -m flows.campaign +campaign={name})")
    current_text = (conf_dir / "campaign" / f"{name}.yaml").read_text()
    analysis = (folder / "analysis.json").read_text()[:20000] if (folder / "analysis.json").exists() else ""
    answer, per_config = last_answer(folder)
    verdicts = (f"Last night's answer: {answer}\nPer configuration against the baseline:\n{per_config}\n"
                "Add seeds where a comparison is unresolved, drop configurations that lost, keep the question, "
                f"the decision rule, the baseline and the metric as they are ({', '.join(FROZEN)}), and cite the "
                "answer in notes.\n\n" if answer else "")
    messages = [{"role": "system", "content": PLAN_SYSTEM.replace("{tasks}", _tasks(conf_dir))},
                {"role": "user", "content": f"The campaign file:\n```yaml\n{current_text}```\n\nLast night's report:\n"
                                            f"{report.read_text()}\n\nanalysis.json:\n{analysis}\n\n{verdicts}Propose "
                                            "the next revision of this campaign (keep the name; members already "
                                            "finished are kept in MLflow and not rerun). Answer with the YAML."}]
    spec = _ask(llm, messages, conf_dir, "propose", name, _keeps(current, conf_dir))
    if answer:
        spec = _cite(spec, answer)
    header = f"Proposed by the research agent after {time.strftime('%Y-%m-%d %H:%M')} from {report}"
    text = _dump(spec, header + (f"\n# Last night's answer: {answer}" if answer else ""))
    pending = folder / "proposals" / "pending.yaml"
    pending.parent.mkdir(parents=True, exist_ok=True)
    pending.write_text(text)
    (folder / "proposals" / f"proposal-{time.strftime('%Y%m%d-%H%M%S')}.yaml").write_text(text)
    diff = "".join(difflib.unified_diff(current_text.splitlines(True), text.splitlines(True),
                                        f"conf/campaign/{name}.yaml", "proposal"))
    proposal = Proposal(pending, spec, diff)
    if auto:
        proposal.path = approve(name, folder, conf_dir)
        proposal.applied = True
    return proposal


def approve(name: str, folder: Path | None = None, conf_dir: Path | str = CONF_DIR) -> Path:
    """Apply the pending proposal: the old file is kept in ``proposals/``, the new one replaces it."""
    conf_dir = Path(conf_dir)
    folder = Path(folder) if folder else campaign_dir(load_campaign_file(name, conf_dir))
    pending = folder / "proposals" / "pending.yaml"
    if not pending.exists():
        raise CampaignError(f"no pending proposal for {name} ({pending})")
    target = conf_dir / "campaign" / f"{name}.yaml"
    if target.exists():
        (folder / "proposals" / f"replaced-{time.strftime('%Y%m%d-%H%M%S')}.yaml").write_text(target.read_text())
    target.write_text(pending.read_text())
    pending.unlink()
    return target


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m research_agent.campaign", description=__doc__.split("\n")[0])
    p.add_argument("description", nargs="?", help="what the campaign should find out, in plain English")
    p.add_argument("--name", help="campaign name (default: the LLM's choice)")
    p.add_argument("--schedule", action="store_true", help="serve the planned campaign on its cron schedule")
    p.add_argument("--propose", metavar="NAME", help="propose the next revision of campaign NAME from its report")
    p.add_argument("--auto", action="store_true", help="apply the proposal without asking")
    p.add_argument("--approve", metavar="NAME", help="apply the pending proposal of campaign NAME")
    p.add_argument("--conf-dir", default=str(CONF_DIR))
    p.add_argument("--config", default="default", help="conf/research_agent/<config>.yaml")
    p.add_argument("--base-url")
    p.add_argument("--api-key")
    p.add_argument("--model")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    conf_dir = Path(args.conf_dir)
    try:
        if args.approve:
            print(f"applied: {approve(args.approve, conf_dir=conf_dir)}")
            return 0
        if not args.description and not args.propose:
            _parser().error("give a description, --propose NAME or --approve NAME")
        llm = ChatLLM(load_settings(load_agent_config(args.config, conf_dir), args.base_url, args.api_key, args.model))
        if args.propose:
            prop = propose_next(llm, args.propose, conf_dir=conf_dir, auto=args.auto)
            print(prop.diff or "(no change proposed)")
            if prop.applied:
                print(f"applied: {prop.path}")
            elif sys.stdin.isatty() and input("apply this proposal? [y/N] ").strip().lower() == "y":
                print(f"applied: {approve(args.propose, conf_dir=conf_dir)}")
            else:
                print(f"pending: {prop.path}\napply with: python -m research_agent.campaign --approve {args.propose}")
            return 0
        path = plan_campaign(llm, args.description, conf_dir, args.name)
    except ResearchAgentError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2 if "No LLM" in str(exc) else 1
    name = path.stem
    print(f"wrote {path}\nrun one night now:  python -m flows.campaign +campaign={name}\n"
          f"serve it nightly:   python -m flows.campaign +campaign={name} --schedule")
    if args.schedule:
        repo = Path(__file__).resolve().parents[1]
        return subprocess.call([sys.executable, "-m", "flows.campaign", f"+campaign={name}", "--schedule"], cwd=repo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
