"""Request bodies of the gateway's routes, as pydantic models (they also make /openapi.json).

OpenAI-compatible bodies accept unknown top-level fields (frameworks send ``extra_body`` keys,
``user``, penalties ...) but refuse known fields of the wrong type. Messages keep whatever keys a
client sends (``name`` on any role, provider extras). Numbers are finite: NaN and infinities are
refused everywhere. Every string, id, integer and free-form JSON value that is stored is sized
to its pool column and free of NUL (:mod:`swarm.web.limits`), so an accepted body is a storable
one on SQLite and PostgreSQL alike. Only shapes are checked here; limits that depend on the served
model or on settings (context, vocabulary, max_tokens cap, n cap) are checked by the routes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from swarm.pool import StepFilter
from swarm.records import EpisodeType
from swarm.web.limits import FreeJSON, Id, Int32, ModelJSONList, ModelText, Name, Task, Text, check_json

__all__ = ["ChatMessage", "ChatCompletionRequest", "CompletionRequest", "EpisodeCreate", "EpisodeEnd", "WhiteboxStep",
           "StepsSubmit", "EventIn", "FeedbackIn", "LeaseRequest", "AckRequest", "LabelIn", "CurationIn", "MAX_MESSAGES",
           "MAX_TOOLS", "MAX_BODY_VALUES"]

TokenId = Annotated[int, Field(ge=0, lt=2**31)]
BigInt = 2**53  # larger integers would overflow the database's 64-bit columns (or JSON doubles)
_BODY_DEPTH = 64  # OpenAI bodies: messages, content parts and tool schemas nest a few levels
# counted before anything else is validated: validating 250k messages took ~1.5 s on the event loop
MAX_MESSAGES = 10_000
MAX_TOOLS = 1_000
MAX_BODY_VALUES = 262_144  # JSON values in one OpenAI body (items of every list and object, unknown keys too)
_COUNTED = {"messages": MAX_MESSAGES, "tools": MAX_TOOLS}

_OPEN = ConfigDict(extra="allow", allow_inf_nan=False)
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class TextPart(BaseModel):
    model_config = _OPEN
    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    model_config = _OPEN
    name: str
    arguments: str | dict[str, Any] = ""  # not necessarily valid JSON: clients echo what they got


class ToolCall(BaseModel):
    model_config = _OPEN
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = _OPEN
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(BaseModel):
    model_config = _OPEN
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(BaseModel):
    model_config = _OPEN
    type: str = "function"
    function: FunctionDef


class StreamOptions(BaseModel):
    model_config = _OPEN
    include_usage: bool | None = None


class _Sampling(BaseModel):
    model_config = _OPEN
    model: str = Field(min_length=1)
    n: int = Field(default=1, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1, lt=2**31)  # vLLM's extra field: 0 or -1 turn it off
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class _Storable(BaseModel):
    """A body whose unknown keys are stored too: the whole raw body is checked (depth, NaN). NUL may be
    there: messages quote what the model wrote, and the pool stores NUL as U+FFFD."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, most in _COUNTED.items():
                if isinstance(data.get(key), list) and len(data[key]) > most:
                    raise ValueError(f"{key}: at most {most} items, got {len(data[key])}")
        return check_json(data, max_depth=_BODY_DEPTH, max_bytes=None, nul_ok=True, max_values=MAX_BODY_VALUES)


class ChatCompletionRequest(_Sampling, _Storable):
    """OpenAI ``POST /v1/chat/completions`` body."""

    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None


class CompletionRequest(_Sampling, _Storable):
    """OpenAI ``POST /v1/completions`` body (one prompt: text or token ids)."""

    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool | None = False
    suffix: str | None = None


class EpisodeCreate(BaseModel):
    """``POST /v1/episodes``."""

    model_config = _STRICT
    task: Task
    group_id: Id | None = None
    client_id: Id | None = None
    type: EpisodeType = EpisodeType.train
    timeout_s: float | None = Field(default=None, gt=0)
    metadata: FreeJSON = Field(default_factory=dict)


class EpisodeEnd(BaseModel):
    """``POST /v1/episodes/{id}/end``; ``step_rewards`` maps step ids to rewards."""

    model_config = _STRICT
    reward: float | None = None
    step_rewards: dict[Id, float] | None = None
    status: Literal["finished", "failed"] = "finished"
    metadata: FreeJSON | None = None


class WhiteboxStep(BaseModel):
    """One white-box step: the agent's own exact ids; any policy name, any length."""

    model_config = _STRICT
    step_id: Id | None = None  # lets a retry be idempotent
    episode_id: Id | None = None  # must be the key's episode if given
    prompt_ids: list[TokenId]  # checked against the policy's vocabulary by the route
    response_ids: list[TokenId]
    response_logprobs: list[float] | None = None
    prompt_messages: ModelJSONList | None = None  # model text: NUL is stored as U+FFFD
    response_text: ModelText | None = None
    tool_calls: ModelJSONList = Field(default_factory=list)
    finish_reason: Name | None = None
    reward: float | None = None
    policy: Task = "default"
    policy_version: Int32 = 0
    parent_step_id: Id | None = None  # must be a step of the same episode
    metadata: FreeJSON = Field(default_factory=dict)


class StepsSubmit(BaseModel):
    """``POST /v1/steps``."""

    model_config = _STRICT
    steps: list[WhiteboxStep] = Field(min_length=1)


class EventIn(BaseModel):
    """``POST /v1/events``: a live event, or with ``kind: "reward"`` a (late) reward."""

    model_config = _STRICT
    kind: Literal["event", "reward"] = "event"
    episode_id: Id | None = None
    step_id: Id | None = None
    response_id: Id | None = None  # the chat completion id a client saw; resolves to its step
    name: Name = ""
    value: float | None = None  # a reward event's value becomes the target's final reward
    payload: FreeJSON = Field(default_factory=dict)


class FeedbackIn(BaseModel):
    """``POST /v1/feedback``: a human (or judge) rating / correction, optionally also a reward."""

    model_config = _STRICT
    episode_id: Id | None = None
    step_id: Id | None = None
    response_id: Id | None = None
    rating: float | None = None
    correction: Text | None = None
    reward: float | None = None
    final: bool = True
    name: Name = ""
    payload: FreeJSON = Field(default_factory=dict)


class LeaseRequest(BaseModel):
    """``POST /v1/pool/leases``."""

    model_config = _STRICT
    filter: StepFilter = Field(default_factory=StepFilter)
    max_steps: int | None = Field(default=None, ge=1, le=BigInt)
    max_groups: int | None = Field(default=None, ge=1, le=BigInt)
    ttl_s: float = Field(default=60.0, gt=0, le=24 * 3600)


class AckRequest(BaseModel):
    model_config = _STRICT
    consumed_version: Int32


class LabelIn(BaseModel):
    model_config = _STRICT
    target: Literal["step", "episode"]
    target_id: Id
    label: Task
    exclude: bool = False
    note: Text = ""


class CurationIn(BaseModel):
    """``POST /v1/pool/curations``: save ``filter`` as the newest version of curation ``name``."""

    model_config = _STRICT
    name: Task  # 1..256 characters; '@' is refused by the pool (it separates the version)
    filter: StepFilter = Field(default_factory=StepFilter)
    note: Text = ""
