"""The research agent's exception tree (see :mod:`research_agent`). Each error carries its context."""

from __future__ import annotations

__all__ = ["ResearchAgentError", "LLMNotConfigured", "LLMError", "SpecError", "CampaignError", "TargetError"]


class ResearchAgentError(Exception):
    """Base of every research-agent error."""


class LLMNotConfigured(ResearchAgentError):
    """No LLM endpoint or model is configured."""


class LLMError(ResearchAgentError):
    """The LLM endpoint failed, or its answer could not be used (``raw`` keeps the answer)."""

    def __init__(self, message: str, raw: str | None = None) -> None:
        super().__init__(message)
        self.raw = raw


class SpecError(ResearchAgentError):
    """A task spec is invalid; the message names the field."""


class CampaignError(ResearchAgentError):
    """A campaign config is invalid; the message names the key and the fix."""


class TargetError(ResearchAgentError):
    """The task's name or folder would clash (a built-in task, a user's file, a shadowed module)."""
