"""The one exception tree of the swarm library.

Every invalid call into swarm raises a subclass of :class:`SwarmError` that says what was
wrong and carries the ids it concerns (episode, step, lease). HTTP layers map these to 4xx
responses with :attr:`SwarmError.status_code`; nothing here knows about HTTP itself.

    SwarmError
    ├── ValidationError        a record or argument is inconsistent (names the field)
    ├── NotFoundError          an episode / step / lease / policy does not exist
    ├── ConflictError          the call contradicts stored state (ended episode, re-used id)
    │   └── LeaseError         a lease is unknown, expired or already acknowledged
    ├── AuthError              a missing, forged or foreign credential
    ├── ConfigError            a config key is missing or wrong (names the key and the fix)
    ├── BackendError           an inference backend failed or refused a request
    │   ├── ContextLengthError the prompt plus max_tokens exceed the model's context
    │   ├── ChecksumError      a model file does not match the checksum recorded for it
    │   ├── RateLimitError     the upstream server answered 429 (swarm.policy.upstream)
    │   ├── VLLMServerError    the local vLLM server did not start or died (swarm.policy.vllm_server)
    │   ├── JudgeReplyError    a judge reply is not the asked JSON; also a ValueError (swarm.judge.prompt)
    │   └── JudgeFailed        every attempt of a judge call failed; also a RuntimeError (swarm.judge.service)
    ├── ApiError               a request the app refuses: HTTP status + OpenAI fields (swarm.web.errors)
    └── ClientError            the gateway refused a call or was unreachable; also a RuntimeError (swarm.client.sdk)

The entry points add theirs under SwarmError too: ``StartError`` (flows.session, a session stage failed
to start) and ``EvalFailed`` (flows.eval, no episode finished), both also RuntimeErrors. The ones named with a module live
with the code that raises them (HTTP, the client SDK, a backend, the judge); this module imports none
of them. The research agent keeps its own tree (research_agent.errors), outside the library.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SwarmError", "ValidationError", "NotFoundError", "ConflictError", "LeaseError", "AuthError", "ConfigError",
           "BackendError", "ContextLengthError", "ChecksumError"]


class SwarmError(Exception):
    """Base of all swarm errors; ``context`` holds the ids the error concerns."""

    status_code: int = 400
    error_type: str = "invalid_request_error"

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = {k: v for k, v in context.items() if v is not None}

    def __str__(self) -> str:
        if not self.context:
            return self.message
        ctx = ", ".join(f"{k}={v}" for k, v in self.context.items())
        return f"{self.message} ({ctx})"


class ValidationError(SwarmError, ValueError):
    """A record or argument is inconsistent; the message names the field."""

    status_code = 422


class NotFoundError(SwarmError, KeyError):
    """An episode, step, lease or policy does not exist."""

    status_code = 404
    error_type = "not_found_error"

    def __str__(self) -> str:  # KeyError would quote the message
        return SwarmError.__str__(self)


class ConflictError(SwarmError):
    """The call contradicts stored state (e.g. writing to an ended episode)."""

    status_code = 409
    error_type = "conflict_error"


class LeaseError(ConflictError):
    """A lease is unknown, expired or already acknowledged."""


class AuthError(SwarmError):
    """A credential is missing, forged, or belongs to another episode."""

    status_code = 401
    error_type = "authentication_error"


class ConfigError(SwarmError, ValueError):
    """A config key is missing or wrong; the message names the key and how to fix it."""


class BackendError(SwarmError):
    """An inference backend failed or refused a request."""

    status_code = 502
    error_type = "backend_error"


class ContextLengthError(BackendError):
    """Prompt tokens plus requested max tokens exceed the model's context window."""

    status_code = 400
    error_type = "invalid_request_error"


class ChecksumError(BackendError):
    """A model file does not match the checksum recorded for it (a corrupt copy or a stale build)."""

    status_code = 500
    error_type = "checksum_error"
