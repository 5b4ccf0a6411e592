"""Stage 3, validate by running: does the generated package work, and can GRPO learn from it?

:func:`validate_package` returns a :class:`ValidationReport` (a list of checks, each ok or not,
with tracebacks) in three layers, stopping at the first layer that fails:

1. static: the required files exist and every ``.py`` file compiles;
2. sandboxed checks (:mod:`research_agent.sandbox` ``check``): imports, signatures, instance
   determinism, the package's reward tests, reward properties, worked examples as oracles;
3. dry run: inside the same sandbox, a real gateway (:func:`swarm.stack.start_stack`) on the
   sandbox's private loopback with the configured policy (the tiny model by default) and a fresh
   SQLite pool in its scratch dir; the package's episodes (or games, for ``run_multiagent``
   tasks) run through the swarm client; then the pool must show every episode finished, steps
   recorded for each, and rewards that vary within a group. When the tiny model's rewards do
   not vary, the worked examples stand in (they must reach at least two reward values) and the
   report's ``no_signal`` says so with advice, for the terminal.

A check that could not run is a failure. Without OS isolation the report says so (a warning
check) and the caller says so on the terminal.

It does not repair anything (:mod:`research_agent.repair` does).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from research_agent.generate import REQUIRED, Location
from research_agent.isolation import Isolation, detect, readable_copy
from research_agent.sandbox import Limits, run_sandboxed
from research_agent.spec import TaskSpec

__all__ = ["Check", "ValidationReport", "ValidateSettings", "validate_package", "dry_run_model", "NO_SIGNAL_ADVICE"]


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    warn: bool = False    # informative: does not fail the report


@dataclass
class ValidationReport:
    checks: list[Check] = field(default_factory=list)
    rewards: dict[str, list[float]] = field(default_factory=dict)
    isolation: str = ""             # how the generated code was run (bubblewrap, or the guard and why)
    no_signal: str = ""             # set when the dry run's rewards never varied within a group

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok or c.warn for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok and not c.warn]

    def add(self, name: str, ok: bool, detail: str = "", warn: bool = False) -> bool:
        self.checks.append(Check(name, ok, detail, warn))
        return ok

    def to_markdown(self) -> str:
        lines = [f"# Validation: {'PASSED' if self.ok else 'FAILED'}", "", f"Ran with {self.isolation}", ""]
        for c in self.checks:
            mark = "ok" if c.ok else ("warn" if c.warn else "FAIL")
            lines.append(f"- [{mark}] {c.name}")
            if c.detail and not c.ok:
                lines.append("  ```\n  " + c.detail.replace("\n", "\n  ") + "\n  ```")
        if self.rewards:
            lines += ["", "Dry-run rewards by group:", ""]
            lines += [f"- {g}: {', '.join(f'{r:.3f}' for r in rs)}" for g, rs in self.rewards.items()]
        return "\n".join(lines) + "\n"

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "validation.md").write_text(self.to_markdown())
        (folder / "validation.json").write_text(json.dumps(asdict(self), indent=1))


@dataclass
class ValidateSettings:
    policy: str = "tiny"          # tiny | echo
    groups: int = 2
    group_size: int = 4
    property_seeds: int = 8
    timeout_s: float = 180.0
    cpu_s: int = 300
    memory_mb: int = 4096
    processes: int = 256          # RLIMIT_NPROC inside bubblewrap (threads count too)
    isolation: str = "auto"       # auto (bubblewrap when it works here, else the guard) | bubblewrap | guard

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> ValidateSettings:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in (cfg or {}).items() if k in known})

    @property
    def limits(self) -> Limits:
        return Limits(timeout_s=self.timeout_s, cpu_s=self.cpu_s, memory_mb=self.memory_mb, processes=self.processes)


def dry_run_model(policy: str) -> Path | None:
    """The tiny warm-started checkpoint for ``policy=tiny`` (shipped, copied into the cache and checked), else None."""
    if policy == "echo":
        return None
    if policy != "tiny":
        raise ValueError(f"validate.policy={policy!r} is unknown; use tiny or echo")
    from swarm.policy.tiny import ensure_tiny_model
    from swarm.policy.warmup import word_chain_warmup

    return ensure_tiny_model(warmup=word_chain_warmup)


def _static(report: ValidationReport, pkg: Path) -> bool:
    missing = [f for f in REQUIRED if not (pkg / f).exists()]
    report.add("required files present", not missing, f"missing: {', '.join(missing)}" if missing else "")
    for path in sorted(pkg.glob("*.py")):
        try:
            compile(path.read_text(), str(path), "exec")
            report.add(f"compiles {path.name}", True)
        except SyntaxError as exc:
            report.add(f"compiles {path.name}", False, f"{path.name}:{exc.lineno}: {exc.msg}\n{exc.text or ''}")
    return report.ok


def _sandbox_checks(report: ValidationReport, loc: Location, spec: TaskSpec, s: ValidateSettings,
                    iso: Isolation) -> list[float]:
    payload = {"module": loc.module, "low": spec.reward.low, "high": spec.reward.high, "seeds": s.property_seeds,
               "examples": [e.model_dump(mode="json") for e in spec.reward.examples]}
    res = run_sandboxed("check", payload, loc.import_root, s.limits, iso)
    if not res.ok:
        report.add("sandboxed checks ran", False, res.error)
        return []
    for c in res.data["checks"]:
        report.add(c["name"], c["ok"], c["detail"], c.get("warn", False))
    return list(res.data.get("oracle_rewards", []))


NO_SIGNAL_ADVICE = ("make the reward denser (partial credit for the answer's format or for partly right answers) "
                    "or the task easier to start with (a curriculum from small instances), so a weak policy "
                    "gets different rewards within a group")


def _dry_run(report: ValidationReport, loc: Location, spec: TaskSpec, s: ValidateSettings, oracle: list[float],
             iso: Isolation) -> None:
    model = dry_run_model(s.policy)
    if model is not None and iso.isolated:
        model = readable_copy(model)  # the sandbox's unprivileged user must read it
    payload = {"module": loc.module, "task": spec.name, "groups": s.groups, "group_size": s.group_size,
               "max_tokens": spec.max_tokens, "seed": 0, "policy": s.policy, "model_path": str(model) if model else None}
    res = run_sandboxed("episodes", payload, loc.import_root, s.limits, iso, readable=(model,) if model else ())
    if not report.add("dry run ran", res.ok, res.error):
        return
    errors = res.data.get("errors", [])
    report.add("episodes run without agent errors", not errors,
               f"{res.data.get('n_errors', 0)} failed; first:\n" + "\n".join(errors[:1]) if errors else "")
    summary = res.data["summary"]
    groups: dict[str, list[float]] = summary["groups"]
    if res.data.get("multiagent"):  # one game per group; every player's episode must finish
        ok = len(groups) == s.groups and summary["finished"] == summary["episodes"] > 0
        report.add("episodes finished", ok, f"{summary['finished']} of {summary['episodes']} player episodes finished "
                                            f"in {len(groups)} of {s.groups} games")
    else:
        expected = s.groups * s.group_size
        report.add("episodes finished", summary["finished"] == expected, f"{summary['finished']} of {expected} finished")
    lacking = summary["without_steps"]
    report.add("steps recorded for every episode", summary["finished"] > 0 and not lacking,
               f"{lacking} finished episodes have no LLM call recorded (run_episode must call llm)" if lacking else
               ("" if summary["finished"] else "no episode finished"))
    report.rewards = groups
    varies = any(len(rs) > 1 and statistics.pvariance(rs) > 0 for rs in groups.values())
    if varies:
        report.add("rewards vary within a group (GRPO has signal)", True)
        return
    flat = sorted({r for rs in groups.values() for r in rs})
    report.no_signal = (f"the dry-run policy ({s.policy}) got the same reward within every group "
                        f"(values seen: {flat}), so training on it would have no signal; {NO_SIGNAL_ADVICE}")
    if len(set(oracle)) >= 2:
        report.add("rewards vary within a group (GRPO has signal)", False,
                   f"{report.no_signal}. The worked examples reach {sorted(set(oracle))}, so the reward can vary once "
                   "the policy improves", warn=True)
    else:
        report.add("rewards vary (dry run or worked examples)", False,
                   f"neither the dry run nor the worked examples give two different rewards; {NO_SIGNAL_ADVICE}")


def validate_package(loc: Location, spec: TaskSpec, settings: ValidateSettings | None = None,
                     isolation: Isolation | None = None) -> ValidationReport:
    """All checks for the package at ``loc`` (import it as ``loc.module`` from ``loc.import_root``)."""
    s = settings or ValidateSettings()
    iso = isolation or detect(s.isolation)
    report = ValidationReport(isolation=iso.describe())
    if not iso.isolated:  # said in the report, and by the caller on the terminal
        report.add("isolation (bubblewrap)", False, iso.describe(), warn=True)
    if not _static(report, loc.package_dir):
        return report
    oracle = _sandbox_checks(report, loc, spec, s, iso)
    if not report.ok:
        return report
    _dry_run(report, loc, spec, s, oracle, iso)
    return report
