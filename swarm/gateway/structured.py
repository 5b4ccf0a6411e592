"""Structured outputs at the gateway: ``response_format``, ``tool_choice`` and ``top_logprobs`` checks.

Turns the OpenAI request fields into a :class:`~swarm.policy.constraint.Constraint` for the
backend, and refuses (400, naming the parameter) what the serving backend cannot honour: a
backend enforces constraints only if it says so (``supports_constraints``) and reports at most
``max_top_logprobs`` alternatives per token. Nothing is accepted and then silently ignored.

It does not build grammars (the backend does, ``swarm.policy.constraint``) or format responses.
"""

from __future__ import annotations

from typing import Any

from swarm.errors import ValidationError
from swarm.gateway.state import GatewayState
from swarm.policy.constraint import Constraint, request_constraint
from swarm.web.errors import ApiError

__all__ = ["chat_constraint", "completion_constraint", "compile_constraint", "top_logprobs", "tool_parser"]


def tool_parser(state: GatewayState, policy: str) -> Any:
    """The backend's tool-call parser for ``policy`` (``call_prefix``/``call_suffix``/``arguments_key``), if it has one."""
    get = getattr(state.backend, "tool_parser", None)
    return get(policy) if callable(get) else get


def _check(state: GatewayState, c: Constraint | None) -> Constraint | None:
    if c is not None and not getattr(state.backend, "supports_constraints", False):
        raise ApiError(400, f"{c.param}: this gateway's {type(state.backend).__name__} backend cannot enforce "
                       "structured outputs", param=c.param, code="unsupported_parameter")
    return c


def chat_constraint(state: GatewayState, policy: str, response_format: Any, tool_choice: Any,
                    tools: list[dict[str, Any]] | None) -> Constraint | None:
    """The constraint a chat request asks for, or a 400 naming the parameter it cannot have."""
    try:
        c = request_constraint(response_format, tool_choice, tools, tool_parser(state, policy))
    except ValidationError as e:
        raise ApiError(400, e.message, param=e.context.get("param"), code="invalid_value") from e
    return _check(state, c)


def completion_constraint(state: GatewayState, extra: dict[str, Any] | None) -> Constraint | None:
    """``response_format`` on ``/v1/completions`` (an extension vLLM also accepts): enforced or refused."""
    rf = (extra or {}).get("response_format")
    try:
        c = request_constraint(rf)
    except ValidationError as e:
        raise ApiError(400, e.message, param=e.context.get("param"), code="invalid_value") from e
    return _check(state, c)


async def compile_constraint(state: GatewayState, policy: str, c: Constraint | None) -> None:
    """Build the backend's grammar off the event loop (cached there); a schema it refuses is a 400 naming the field."""
    compile_ = getattr(state.backend, "compile_constraint", None)
    if c is None or not callable(compile_):
        return
    try:
        await state.cpu(compile_, policy, c)
    except ValidationError as e:
        raise ApiError(400, e.message, param=e.context.get("param") or c.param, code="invalid_value") from e


def top_logprobs(state: GatewayState, requested: int | None, logprobs: bool, param: str = "top_logprobs") -> int:
    """How many alternatives per token to report (0: none); a 400 when the backend cannot report that many."""
    k = int(requested or 0)
    if k <= 0:
        return 0
    if not logprobs:
        raise ApiError(400, f"{param} requires logprobs: true", param=param, code="invalid_value")
    cap = int(getattr(state.backend, "max_top_logprobs", 0))
    if k > cap:
        raise ApiError(400, f"{param} is {k}; the {type(state.backend).__name__} backend reports at most {cap} "
                       "alternatives per token", param=param, code="unsupported_parameter")
    return k
