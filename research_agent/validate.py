"""Stage 3, validate by running: does the generated package work, and can GRPO learn from it?

:func:`validate_package` returns a :class:`ValidationReport` (a list of checks, each ok or not,
with tracebacks) in three layers, stopping at the first layer that fails:

1. static: the required files exist and every ``.py`` file compiles;
2. sandboxed checks (:mod:`research_agent.sandbox` ``check``): imports, signatures, instance
   determinism, the package's reward tests, reward properties, worked examples as oracles;
3. dry run: a real gateway (:func:`swarm.stack.start_stack`) on loopback with the configured
   policy (the tiny model by default) and a fresh SQLite pool; the package's episodes run in
   the sandbox through the swarm client; then the pool must show every episode finished, steps
   recorded for each, and rewards that vary within a group. When the tiny model's rewards do
   not vary, the worked examples stand in: they must reach at least two reward values.

It does not repair anything (:mod:`research_agent.repair` does).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from research_agent.generate import REQUIRED, Target
from research_agent.sandbox import Limits, run_sandboxed
from research_agent.spec import TaskSpec

__all__ = ["Check", "ValidationReport", "ValidateSettings", "validate_package", "dry_run_backend"]


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

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok or c.warn for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok and not c.warn]

    def add(self, name: str, ok: bool, detail: str = "", warn: bool = False) -> bool:
        self.checks.append(Check(name, ok, detail, warn))
        return ok

    def to_markdown(self) -> str:
        lines = [f"# Validation: {'PASSED' if self.ok else 'FAILED'}", ""]
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

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> ValidateSettings:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in (cfg or {}).items() if k in known})

    @property
    def limits(self) -> Limits:
        return Limits(timeout_s=self.timeout_s, cpu_s=self.cpu_s, memory_mb=self.memory_mb)


_BACKENDS: dict[str, Any] = {}


def dry_run_backend(policy: str) -> Any:
    """The dry run's policy backend, built once per process (the tiny model loads in seconds)."""
    if policy not in _BACKENDS:
        from swarm.policy import build_backend

        if policy == "echo":
            _BACKENDS[policy] = build_backend("echo")
        elif policy == "tiny":
            from swarm.policy.tiny import ensure_tiny_model
            from swarm.policy.warmup import word_chain_warmup

            path = ensure_tiny_model(warmup=word_chain_warmup)
            _BACKENDS[policy] = build_backend("hf", model_path=str(path), policies=["default"])
        else:
            raise ValueError(f"validate.policy={policy!r} is unknown; use tiny or echo")
    return _BACKENDS[policy]


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


def _sandbox_checks(report: ValidationReport, target: Target, spec: TaskSpec, s: ValidateSettings) -> list[float]:
    payload = {"module": target.module, "low": spec.reward.low, "high": spec.reward.high, "seeds": s.property_seeds,
               "examples": [e.model_dump(mode="json") for e in spec.reward.examples]}
    res = run_sandboxed("check", payload, target.import_root, s.limits)
    if not res.ok:
        report.add("sandboxed checks ran", False, res.error)
        return []
    for c in res.data["checks"]:
        report.add(c["name"], c["ok"], c["detail"], c.get("warn", False))
    return list(res.data.get("oracle_rewards", []))


def _dry_run(report: ValidationReport, target: Target, spec: TaskSpec, s: ValidateSettings, oracle: list[float],
             backend: Any) -> None:
    from swarm.pool import Pool, StepFilter
    from swarm.stack import start_stack

    with tempfile.TemporaryDirectory(prefix="ra-dryrun-") as tmp:
        pool = Pool(f"sqlite:///{Path(tmp) / 'pool.db'}")
        try:
            with start_stack(pool, backend) as stack:
                payload = {"server": stack.url, "module": target.module, "groups": s.groups,
                           "group_size": s.group_size, "max_tokens": spec.max_tokens, "seed": 0}
                res = run_sandboxed("episodes", payload, target.import_root, s.limits)
            if not report.add("dry run ran", res.ok, res.error):
                return
            errors = res.data.get("errors", [])
            report.add("episodes run without agent errors", not errors,
                       f"{res.data.get('n_errors', 0)} failed; first:\n" + "\n".join(errors[:1]) if errors else "")
            expected = s.groups * s.group_size
            eps = pool.query_episodes(StepFilter(task=spec.name), limit=1000)
            finished = [e for e in eps if e.status.value == "finished"]
            report.add("episodes finished", len(finished) == expected, f"{len(finished)} of {expected} finished")
            steps = pool.query_steps(StepFilter(task=spec.name), limit=10_000)
            with_steps = {st.episode_id for st in steps}
            lacking = [e.episode_id for e in finished if e.episode_id not in with_steps]
            report.add("steps recorded for every episode", bool(finished) and not lacking,
                       f"{len(lacking)} finished episodes have no LLM call recorded (run_episode must call llm)"
                       if lacking else "")
            groups: dict[str, list[float]] = {}
            for e in finished:
                groups.setdefault(e.group_id or e.episode_id, []).append(float(e.reward or 0.0))
            report.rewards = groups
            varies = any(len(rs) > 1 and statistics.pvariance(rs) > 0 for rs in groups.values())
            if varies:
                report.add("rewards vary within a group (GRPO has signal)", True)
            elif len(set(oracle)) >= 2:
                report.add("rewards vary within a group (GRPO has signal)", False,
                           f"the dry-run policy scored a constant reward; the worked examples reach {sorted(set(oracle))}, "
                           "so the reward can vary once the policy improves", warn=True)
            else:
                report.add("rewards vary (dry run or worked examples)", False,
                           "neither the dry run nor the worked examples give two different rewards")
        finally:
            pool.close()


def validate_package(target: Target, spec: TaskSpec, settings: ValidateSettings | None = None,
                     backend: Any = None) -> ValidationReport:
    """All checks for the package at ``target``; ``backend`` overrides the dry-run policy."""
    s = settings or ValidateSettings()
    report = ValidationReport()
    if not _static(report, target.package_dir):
        return report
    oracle = _sandbox_checks(report, target, spec, s)
    if not report.ok:
        return report
    _dry_run(report, target, spec, s, oracle, backend if backend is not None else dry_run_backend(s.policy))
    return report
