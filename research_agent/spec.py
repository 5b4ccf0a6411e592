"""Stage 1, spec: a plain-English description becomes a structured, editable task spec.

The spec says what an instance is and how instances are made (or which small data file), the
agent workflow (single or multi turn, tools, roles), the reward with worked examples (an
instance, an answer, the reward it must get) and the success criterion. It is saved as
``spec.yaml`` in the task folder; edit it and pass ``--spec`` to regenerate from it.

It does not generate code; the worked examples double as oracle answers in validation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from research_agent.errors import LLMError, SpecError
from research_agent.llm import ChatLLM

__all__ = ["TaskSpec", "InstanceSpec", "WorkflowSpec", "RewardSpec", "WorkedExample", "draft_spec", "parse_spec",
           "load_spec", "save_spec", "extract_json", "SPEC_SYSTEM"]

NAME_RE = re.compile(r"^[a-z][a-z0-9_]{1,40}$")


class _M(BaseModel):
    model_config = ConfigDict(extra="ignore")


class InstanceSpec(_M):
    description: str                      # what one instance is
    fields: dict[str, str] = Field(default_factory=dict)  # key -> meaning
    generation: str                       # how make_instance(seed) builds one (or reads data_file)
    data_file: str | None = None          # optional small data file shipped in the package


class WorkflowSpec(_M):
    turns: Literal["single", "multi"] = "single"
    max_turns: int = Field(default=1, ge=1, le=20)
    tools: list[str] = Field(default_factory=list)
    roles: list[str] = Field(default_factory=list)
    prompt: str = ""                      # what the agent is told


class WorkedExample(_M):
    instance: dict[str, Any]
    answer: str | None
    reward: float
    why: str = ""


class RewardSpec(_M):
    definition: str
    low: float = 0.0
    high: float = 1.0
    examples: list[WorkedExample] = Field(min_length=2)
    # "judge": no exact checker; an LLM judge ranks each group under ``rubric`` (docs/judge.md) and
    # compute_reward scores the answer's form only (the agent's own report, kept in the history)
    kind: Literal["function", "judge"] = "function"
    rubric: str = ""

    @model_validator(mode="after")
    def _range(self) -> RewardSpec:
        if self.kind == "judge" and not self.rubric.strip():
            raise ValueError("reward.rubric: a judge reward needs a rubric (what a better answer does)")
        if self.low >= self.high:
            raise ValueError(f"reward.low ({self.low}) must be below reward.high ({self.high})")
        for i, ex in enumerate(self.examples):
            if not self.low <= ex.reward <= self.high:
                raise ValueError(f"reward.examples[{i}].reward={ex.reward} is outside [{self.low}, {self.high}]")
        return self


class TaskSpec(_M):
    name: str
    summary: str
    description: str = ""                 # the researcher's words, verbatim
    instance: InstanceSpec
    workflow: WorkflowSpec = Field(default_factory=WorkflowSpec)
    reward: RewardSpec
    success: str
    group_size: int = Field(default=4, ge=2, le=64)
    max_tokens: int = Field(default=32, ge=1, le=4096)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"name {v!r} must be a lowercase Python identifier (a-z, 0-9, _; 2-41 chars)")
        return v


SPEC_SYSTEM = """You design reinforcement-learning tasks for LLM agents on the swarmpool platform.
Turn the researcher's description into a task spec. Answer with ONE JSON object only, with keys:
  name (lowercase identifier), summary (one line),
  instance: {description, fields: {key: meaning}, generation (how instance i is built from an integer seed,
             deterministic; or name a small data_file shipped with the task), data_file (or null)},
  workflow: {turns: "single"|"multi", max_turns, tools: [names], roles: [names] (two or more roles played by the
             policy make a multi-agent game: one episode per seat), prompt (what the agent is told)},
  reward: {definition (exact formula), low, high, examples: [at least 3 of {instance, answer, reward, why}],
           covering a correct answer, a wrong but well-formed answer, and a malformed answer},
  success (when the task counts as learned), group_size (episodes per prompt group, 4-8),
  max_tokens (reply budget per call, small).
Rewards must be a pure function of (instance, answer text) and vary between answers.
When no formula can check an answer (open-ended writing, negotiation, advice), add to reward
kind: "judge" and rubric (what a better answer does, for an LLM judge that compares a group of answers
side by side); the definition and examples then score only the answer's form (empty or malformed: low)."""


def extract_json(text: str) -> dict[str, Any]:
    """The first JSON object in an LLM answer (inside a ```json fence or bare)."""
    fenced = re.search(r"```(?:json)?\s*(\{.*?\})\s*```", text, re.S)
    candidates = [fenced.group(1)] if fenced else []
    start, end = text.find("{"), text.rfind("}")
    if start >= 0 and end > start:
        candidates.append(text[start:end + 1])
    for c in candidates:
        try:
            data = json.loads(c)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data
    raise LLMError("the answer holds no JSON object", raw=text)


def parse_spec(data: dict[str, Any], description: str = "", name: str | None = None) -> TaskSpec:
    """Validate a spec dict; ``name`` (the --name flag) and the description override the LLM's."""
    data = dict(data)
    if name:
        data["name"] = name
    if description:
        data["description"] = description
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise SpecError(f"task spec is invalid: {problems}") from exc


def draft_spec(llm: ChatLLM, description: str, name: str | None = None, attempts: int = 2) -> TaskSpec:
    """Ask the LLM for a spec; an invalid one is sent back once with the reason."""
    messages = [{"role": "system", "content": SPEC_SYSTEM}, {"role": "user", "content": description}]
    err: Exception | None = None
    for _ in range(attempts):
        answer = llm.complete(messages, stage="spec")
        try:
            return parse_spec(extract_json(answer), description, name)
        except (LLMError, SpecError) as exc:
            err = exc
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": f"That spec is not usable: {exc}. Answer with the corrected JSON object only."}]
    raise SpecError(f"no valid spec after {attempts} answers: {err}")


def save_spec(spec: TaskSpec, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, allow_unicode=True))
    return path


def load_spec(path: Path | str) -> TaskSpec:
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a spec is a YAML mapping")
    return parse_spec(data)
