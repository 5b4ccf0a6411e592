"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: Anthropic's Messages API over the chat path.

Same guarantees as ``/v1/chat/completions``: the episode api key (the Anthropic SDK sends it as
``x-api-key``; ``Authorization: Bearer`` works too), one step per call with exact ids and logprobs
(``metadata.protocol: "messages"``, the Message ``id`` as the step's ``response_id``), prefix
consistency across turns, ``Idempotency-Key`` replay. Every error, auth and validation included,
is in Anthropic's shape (:class:`AnthropicErrors`). Translation: :mod:`swarm.gateway.messages_api`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic
from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from swarm.gateway.bridge import collect, run_chat, translated_events
from swarm.gateway.messages_api import (
    PARAMS,
    CountTokensRequest,
    MessagesRequest,
    MessagesTranslator,
    error_response,
    to_chat,
)
from swarm.gateway.prefix import normalize_messages
from swarm.gateway.routes_openai import idempotency_key
from swarm.gateway.state import GatewayState, State
from swarm.gateway.streaming import as_api_error, sse_response
from swarm.web.auth import Caller
from swarm.web.errors import ApiError, describe_validation
from swarm.web.state import episode_caller

__all__ = ["router", "AnthropicErrors"]

class AnthropicErrors(APIRoute):
    """A route whose errors (auth, body validation and handler errors alike) answer in Anthropic's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except (RequestValidationError, pydantic.ValidationError) as exc:
                return error_response(describe_validation(list(exc.errors())))
            except StarletteHTTPException as exc:
                detail = exc.detail if isinstance(exc.detail, str) else "request failed"
                return error_response(ApiError(exc.status_code, detail))
            except UnicodeError as exc:
                return error_response(ApiError(400, f"text in the request is not valid unicode: {exc}"))
            except Exception as exc:  # the Messages API answers every failure in its own error shape
                return error_response(as_api_error(exc))

        return answer


router = APIRouter(tags=["anthropic"], route_class=AnthropicErrors)


@router.post("/v1/messages")
async def create_message(body: MessagesRequest, request: Request, caller: Caller = Depends(episode_caller),
                         state: GatewayState = Depends(State)) -> Any:
    """Anthropic Messages API; ``model`` picks the policy, ``stream`` picks SSE ``message_*`` events."""
    key = idempotency_key(request)
    run = await run_chat(state, caller, to_chat(body), cid=f"msg_{uuid.uuid4().hex}", protocol="messages",
                         key=key, params=PARAMS, max_tokens_ceiling=body.max_tokens)
    tr = MessagesTranslator(body, run)
    if body.stream:
        return sse_response(translated_events(tr, run))
    return JSONResponse(await collect(tr, run))


@router.post("/v1/messages/count_tokens")
async def count_tokens(body: CountTokensRequest, caller: Caller = Depends(episode_caller),
                       state: GatewayState = Depends(State)) -> dict[str, int]:
    """``{"input_tokens": n}``: the prompt a Messages call with this body would start from (nothing is stored)."""
    chat = to_chat(body)
    if chat.model not in state.backend.policies():
        raise ApiError(404, f"the model {chat.model!r} does not exist on this gateway", param="model",
                       code="model_not_found")
    messages = normalize_messages([m.model_dump(exclude_none=True) for m in chat.messages])
    tools = [t.model_dump(exclude_none=True) for t in chat.tools] if chat.tools else None
    chars = sum(len(str(m.get("content") or "")) for m in messages)

    def count() -> int:
        return len(state.backend.encode(chat.model, state.backend.render_chat(chat.model, messages, tools, True)))

    try:
        return {"input_tokens": await state.cpu(count, chars=chars)}
    except ApiError:
        raise
    except Exception as exc:  # a chat template refusing these messages is the request's fault
        raise ApiError(400, f"the chat template cannot render these messages: {type(exc).__name__}: {exc}",
                       param="messages", code="template_error") from exc
