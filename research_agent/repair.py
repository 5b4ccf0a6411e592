"""Stage 4, repair: generate, validate, and send failures back to the LLM, up to N attempts.

:func:`build_task` builds in a temporary staging folder (imported under a unique module name,
so nothing the user or the repository has can shadow it): it writes attempt 1 from the LLM's
files, validates it, and on failure asks for corrected files with the failing checks and their
tracebacks. A repair that changes nothing is not validated again. Only a package that passes is
moved into ``<out>/<name>/``, and only then is ``conf/task/<name>.yaml`` written (last).

Files in the package folder that the agent did not write (no entry in ``research/manifest.json``)
are never deleted; one that a generated file would replace is kept under
``research/kept-<time>/``. This run's reports (``research/attempt-<k>/``, the last failing
attempt's files under ``files/``) replace the previous run's, and the LLM transcript
(``research/transcript.jsonl``) is saved in every outcome, errors included.

It does not decide what counts as working (:mod:`research_agent.validate` does).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from research_agent.errors import LLMError
from research_agent.generate import (
    CONTRACT,
    Location,
    Target,
    TaskFiles,
    generate_files,
    parse_files,
    write_files,
    write_task_config,
)
from research_agent.isolation import Isolation, detect
from research_agent.llm import ChatLLM
from research_agent.spec import TaskSpec
from research_agent.validate import ValidateSettings, ValidationReport, validate_package

__all__ = ["BuildResult", "build_task", "repair_messages", "research_dir", "save_transcript", "install_package"]

Log = Callable[..., None]


def _print(msg: str, style: str = "") -> None:
    print(msg)


@dataclass
class BuildResult:
    target: Target
    spec: TaskSpec
    reports: list[ValidationReport] = field(default_factory=list)
    config_path: Path | None = None
    isolation: Isolation | None = None

    @property
    def ok(self) -> bool:
        return bool(self.reports) and self.reports[-1].ok

    @property
    def attempts(self) -> int:
        return len(self.reports)


def research_dir(target: Target) -> Path:
    return target.package_dir / "research"


def repair_messages(spec: TaskSpec, files: TaskFiles, report: ValidationReport) -> list[dict[str, str]]:
    listing = "\n".join(f"<<<FILE {n}>>>\n{body.rstrip()}\n<<<END>>>" for n, body in files.items())
    failures = "\n\n".join(f"- {c.name}:\n{c.detail}" for c in report.failures())
    return [
        {"role": "system", "content": "You fix Python task packages for RL training of LLM agents.\n" + CONTRACT},
        {"role": "user", "content": f"Task spec:\n{yaml.safe_dump(spec.model_dump(mode='json'), sort_keys=False)}\n"
                                    f"Current package:\n{listing}\n\nValidation by running it failed:\n{failures}\n\n"
                                    "Fix the cause. Answer with the corrected files in the same format "
                                    "(files you do not change may be left out)."},
    ]


def save_transcript(llm: ChatLLM, path: Path) -> Path:
    """Write every LLM exchange so far (answers and errors) as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for entry in llm.transcript:
            f.write(json.dumps(entry) + "\n")
    return path


def _manifest(pkg: Path) -> list[str]:
    path = pkg / "research" / "manifest.json"
    try:
        return list(json.loads(path.read_text())["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def install_package(target: Target, files: TaskFiles, log: Log = _print) -> list[Path]:
    """Move validated files into ``<out>/<name>/``: replace the agent's old files, keep everyone else's."""
    pkg = target.package_dir
    pkg.mkdir(parents=True, exist_ok=True)
    ours = set(_manifest(pkg))
    kept = pkg / "research" / f"kept-{time.strftime('%Y%m%d-%H%M%S')}"
    for name in files:
        path = pkg / name
        if path.exists() and name not in ours:  # a file the agent did not write: keep a copy
            kept.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, kept / name)
            log(f"install: {path} was not written by the research agent; kept a copy in {kept / name}", "yellow")
    for name in sorted(ours - set(files)):  # the agent's own files from an earlier run that are gone now
        (pkg / name).unlink(missing_ok=True)
    written = []
    for name, body in files.items():
        tmp = pkg / f".{name}.ra-tmp"
        tmp.write_text(body)
        os.replace(tmp, pkg / name)
        written.append(pkg / name)
    (pkg / "research").mkdir(exist_ok=True)
    (pkg / "research" / "manifest.json").write_text(json.dumps({"files": sorted(files)}, indent=1))
    shutil.rmtree(pkg / "__pycache__", ignore_errors=True)
    return written


def _replace_research(target: Target, staged: Path) -> None:
    """This run's reports replace the previous run's (the manifest and kept copies stay)."""
    folder = research_dir(target)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("attempt-*"):
        shutil.rmtree(old)
    for new in staged.glob("attempt-*"):
        shutil.copytree(new, folder / new.name)


def build_task(llm: ChatLLM, spec: TaskSpec, target: Target, settings: ValidateSettings | None = None,
               max_attempts: int = 3, log: Log = _print) -> BuildResult:
    """Generate, validate and repair until the package passes or ``max_attempts`` are used."""
    settings = settings or ValidateSettings()
    result = BuildResult(target, spec, isolation=detect(settings.isolation))
    if not result.isolation.isolated:
        log(f"WARNING: {result.isolation.describe()}", "bold red")
    stage_module = f"ra_stage_{secrets.token_hex(4)}"
    try:
        with tempfile.TemporaryDirectory(prefix="ra-build-") as tmp:
            root = Path(tmp)
            root.chmod(0o755)  # readable by the sandbox's unprivileged user
            loc = Location(root / stage_module / spec.name, f"{stage_module}.{spec.name}", root)
            reports = root / "reports"
            files = generate_files(llm, spec)
            log(f"generate: {', '.join(sorted(files))} (staged in {loc.package_dir})")
            attempt = 0
            while attempt < max_attempts:
                attempt += 1
                write_files(loc.package_dir, files)
                report = validate_package(loc, spec, settings, result.isolation)
                report.save(reports / f"attempt-{attempt}")
                result.reports.append(report)
                failed = report.failures()
                log(f"validate (attempt {attempt}/{max_attempts}): {'passed' if report.ok else 'FAILED'} "
                    f"({len(report.checks) - len(failed)}/{len(report.checks)} checks ok)")
                for c in failed:
                    log(f"  FAIL {c.name}: {c.detail.strip().splitlines()[-1] if c.detail.strip() else ''}")
                if report.no_signal:
                    log(f"no training signal: {report.no_signal}", "bold yellow")
                if report.ok:
                    break
                write_files(reports / f"attempt-{attempt}" / "files", files)
                if attempt == max_attempts:
                    break
                changed = _ask_repair(llm, spec, files, report, attempt, max_attempts, log)
                if changed is None:
                    break
                files = {**files, **changed}
            _replace_research(target, reports)
            if result.ok:
                install_package(target, files, log)
                result.config_path = write_task_config(target, spec)  # registered last
    finally:
        save_transcript(llm, research_dir(target) / "transcript.jsonl")
    return result


def _ask_repair(llm: ChatLLM, spec: TaskSpec, files: TaskFiles, report: ValidationReport, attempt: int,
                max_attempts: int, log: Log) -> TaskFiles | None:
    """The LLM's changed files; None when no answer within the attempts left changes anything."""
    for _ in range(max_attempts - attempt):
        try:
            changed = parse_files(llm.complete(repair_messages(spec, files, report), stage=f"repair-{attempt}"))
        except LLMError as exc:
            log(f"repair: unusable answer ({exc}); asking again")
            continue
        real = {n: b for n, b in changed.items() if files.get(n) != b}
        if real:
            log(f"repair: the LLM rewrote {', '.join(sorted(real))}")
            return real
        log("repair: the answer changes nothing; not validating the same files again")
        return None
    return None
