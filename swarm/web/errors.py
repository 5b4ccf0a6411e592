"""HTTP errors of the gateway, all in OpenAI's shape: ``{"error": {"type", "message", "param", "code"}}``.

:class:`ApiError` is what route code raises; :func:`install_error_handlers` maps it, the swarm
error tree (:mod:`swarm.errors`), request validation failures, malformed JSON and unknown
routes onto 4xx responses. An unexpected exception still answers in the same shape (500), but
no input is supposed to get there. This module does not log or retry.
"""

from __future__ import annotations

import logging
from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from swarm.errors import SwarmError, ValidationError

__all__ = ["ApiError", "error_body", "error_response", "install_error_handlers", "describe_validation"]

log = logging.getLogger("swarm.gateway")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class ApiError(SwarmError):
    """A request the app refuses, with its HTTP status and OpenAI error fields (a :class:`SwarmError`)."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type: str | None = None) -> None:  # noqa: A002 - OpenAI's field name
        super().__init__(message)
        self.status = self.status_code = status
        self.code = code
        self.param = param
        self.type = self.error_type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")


def _printable(text: str | None) -> str | None:
    """``text`` with anything UTF-8 cannot encode (a lone surrogate quoted from the input) escaped."""
    if text is None or text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:  # noqa: A002
    return {"error": {"message": _printable(message), "type": type, "param": _printable(param), "code": code}}


def error_response(err: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(error_body(err.message, err.type, err.param, err.code), status_code=err.status, headers=headers)


def from_swarm_error(exc: SwarmError) -> ApiError:
    """The HTTP answer to a swarm error: itself for an :class:`ApiError`, else its status, type and context."""
    if isinstance(exc, ApiError):
        return exc
    status = exc.status_code if 400 <= exc.status_code < 600 else 400
    if isinstance(exc, ValidationError):
        status = 400  # OpenAI answers invalid requests with 400, whoever noticed
    code = exc.context.get("code") if isinstance(exc.context.get("code"), str) else None
    param = exc.context.get("param") if isinstance(exc.context.get("param"), str) else None
    return ApiError(status, str(exc), code=code, param=param, type=exc.error_type)


def _loc(loc: tuple[Any, ...] | list[Any]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or None


_NOT_AN_OBJECT = ("missing", "model_attributes_type", "model_type", "dict_type")


def describe_validation(errors: list[dict[str, Any]]) -> ApiError:
    """One 400 naming the first bad field (and how many others there are) from pydantic errors."""
    if not errors:
        return ApiError(400, "invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return ApiError(400, f"request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}",
                        code="invalid_json")
    param = _loc(first.get("loc", ()))
    if param is None and tuple(first.get("loc", ())) == ("body",):
        if first.get("type") in _NOT_AN_OBJECT:
            what = "missing" if first.get("type") == "missing" else "not a JSON object"
            return ApiError(400, f"the request body is {what}; send a JSON object (Content-Type: application/json)",
                            code="invalid_json")
        # a check of the whole body (NUL, nesting depth, NaN): say which, not "not a JSON object"
        msg = f"request body: {str(first.get('msg')).removeprefix('Value error, ')}"
        return ApiError(400, msg + _more(errors), code="invalid_value")
    msg = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    return ApiError(400, msg + _more(errors), code="invalid_value", param=param)


def _more(errors: list[dict[str, Any]]) -> str:
    return f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(SwarmError)
    async def _swarm_error(request: Request, exc: SwarmError) -> JSONResponse:
        return error_response(from_swarm_error(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(describe_validation(list(exc.errors())))

    @app.exception_handler(pydantic.ValidationError)
    async def _pyd_validation(request: Request, exc: pydantic.ValidationError) -> JSONResponse:
        return error_response(describe_validation(list(exc.errors())))

    @app.exception_handler(UnicodeError)
    async def _unicode(request: Request, exc: UnicodeError) -> JSONResponse:
        return error_response(ApiError(400, f"text in the request is not valid unicode: {exc}", code="invalid_unicode"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404 and msg == "Not Found":
            msg = f"no route {request.method} {request.url.path}"
        return error_response(ApiError(exc.status_code, msg))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500)
