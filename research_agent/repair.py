"""Stage 4, repair: generate, validate, and send failures back to the LLM, up to N attempts.

:func:`build_task` writes attempt 1 from the LLM's files, validates it, and on failure asks for
corrected files with the failing checks and their tracebacks; each attempt's report is saved
under ``<package>/research/attempt-<k>/`` and the LLM transcript in
``<package>/research/transcript.jsonl``. A repair answer may return only the files it changes.

It does not decide what counts as working (:mod:`research_agent.validate` does).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from research_agent.errors import LLMError
from research_agent.generate import (
    CONTRACT,
    Target,
    TaskFiles,
    generate_files,
    parse_files,
    write_package,
    write_task_config,
)
from research_agent.llm import ChatLLM
from research_agent.spec import TaskSpec
from research_agent.validate import ValidateSettings, ValidationReport, validate_package

__all__ = ["BuildResult", "build_task", "repair_messages", "research_dir"]


@dataclass
class BuildResult:
    target: Target
    spec: TaskSpec
    reports: list[ValidationReport] = field(default_factory=list)
    config_path: Path | None = None

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


def _save_transcript(llm: ChatLLM, target: Target) -> None:
    folder = research_dir(target)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "transcript.jsonl").open("w") as f:
        for entry in llm.transcript:
            f.write(json.dumps(entry) + "\n")


def build_task(llm: ChatLLM, spec: TaskSpec, target: Target, settings: ValidateSettings | None = None,
               max_attempts: int = 3, backend: Any = None, log: Callable[[str], None] = print) -> BuildResult:
    """Generate, validate and repair until the package passes or ``max_attempts`` are used."""
    result = BuildResult(target, spec)
    files = generate_files(llm, spec)
    log(f"generate: {', '.join(sorted(files))} -> {target.package_dir}")
    for attempt in range(1, max_attempts + 1):
        write_package(target, files)
        result.config_path = write_task_config(target, spec)
        report = validate_package(target, spec, settings, backend)
        report.save(research_dir(target) / f"attempt-{attempt}")
        result.reports.append(report)
        _save_transcript(llm, target)
        failed = report.failures()
        log(f"validate (attempt {attempt}/{max_attempts}): {'passed' if report.ok else 'FAILED'} "
            f"({len(report.checks) - len(failed)}/{len(report.checks)} checks ok)")
        for c in failed:
            log(f"  FAIL {c.name}: {c.detail.strip().splitlines()[-1] if c.detail.strip() else ''}")
        if report.ok or attempt == max_attempts:
            break
        try:
            changed = parse_files(llm.complete(repair_messages(spec, files, report), stage=f"repair-{attempt}"))
        except LLMError as exc:
            log(f"repair: unusable answer ({exc}); trying again with the same files")
            continue
        log(f"repair: the LLM rewrote {', '.join(sorted(changed)) or 'nothing'}")
        files = {**files, **changed}
    _save_transcript(llm, target)
    return result
