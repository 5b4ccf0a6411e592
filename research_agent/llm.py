"""The research agent's LLM: an OpenAI-compatible chat endpoint, configured once.

Settings come from ``conf/research_agent/<name>.yaml`` (``llm:``), then the environment
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``RESEARCH_AGENT_MODEL``), then explicit arguments, each
overriding the one before. With no model configured :func:`load_settings` raises
:class:`LLMNotConfigured` with a message that says how to set one. Every exchange is kept in
``ChatLLM.transcript`` so the stages can save what was asked and answered.

A failed call (transport error, HTTP error, a 200 whose body is not a chat completion, an empty
answer) is retried a bounded number of times (``retries``, default 2) and then raised as one
:class:`LLMError` with a clear message; failed tries are kept in the transcript too. It does not
judge answers (the stages do) and holds no prompts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from research_agent.errors import LLMError, LLMNotConfigured

__all__ = ["LLMSettings", "ChatLLM", "load_settings", "load_agent_config", "CONF_DIR", "HOW_TO_CONFIGURE"]

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

HOW_TO_CONFIGURE = (
    "No LLM is configured for the research agent. Set one of:\n"
    "  - environment: OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... RESEARCH_AGENT_MODEL=<model>\n"
    "  - flags: --base-url URL --api-key KEY --model MODEL\n"
    "  - a config file conf/research_agent/<name>.yaml with llm.base_url / llm.api_key / llm.model,\n"
    "    used with --config <name> (see conf/research_agent/local_vllm.yaml)."
)


@dataclass
class LLMSettings:
    model: str
    base_url: str | None = None
    api_key: str | None = None
    temperature: float = 0.2
    max_tokens: int = 8000
    timeout_s: float = 300.0
    retries: int = 2              # extra tries after a failed call
    retry_wait_s: float = 2.0     # doubled after each failed try


def _read_yaml(conf_dir: Path, name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """``conf/research_agent/<name>.yaml`` with its ``defaults:`` list merged in (one level of Hydra's idea)."""
    path = conf_dir / "research_agent" / f"{name}.yaml"
    if not path.exists():
        raise LLMNotConfigured(f"research agent config {path} does not exist.\n{HOW_TO_CONFIGURE}")
    data = yaml.safe_load(path.read_text()) or {}
    merged: dict[str, Any] = {}
    for base in data.pop("defaults", []) or []:
        if base != "_self_" and base not in seen:
            merged = _merge(merged, _read_yaml(conf_dir, str(base), seen + (name,)))
    return _merge(merged, data)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_agent_config(name: str = "default", conf_dir: Path | str = CONF_DIR) -> dict[str, Any]:
    """The whole research-agent config (``llm``, ``validate``, ``max_attempts``)."""
    return _read_yaml(Path(conf_dir), name)


def load_settings(config: dict[str, Any] | None = None, base_url: str | None = None, api_key: str | None = None,
                  model: str | None = None) -> LLMSettings:
    """Resolve the LLM settings (file < environment < arguments); raise LLMNotConfigured without a model."""
    llm = dict((config or {}).get("llm") or {})
    env = {"base_url": os.environ.get("OPENAI_BASE_URL"), "api_key": os.environ.get("OPENAI_API_KEY"),
           "model": os.environ.get("RESEARCH_AGENT_MODEL")}
    args = {"base_url": base_url, "api_key": api_key, "model": model}
    for layer in (env, args):
        llm.update({k: v for k, v in layer.items() if v})
    if not llm.get("model") or not (llm.get("base_url") or llm.get("api_key")):
        raise LLMNotConfigured(HOW_TO_CONFIGURE)
    return LLMSettings(model=str(llm["model"]), base_url=llm.get("base_url"), api_key=llm.get("api_key"),
                       temperature=float(llm.get("temperature", 0.2)), max_tokens=int(llm.get("max_tokens", 8000)),
                       timeout_s=float(llm.get("timeout_s", 300)), retries=int(llm.get("retries", 2)),
                       retry_wait_s=float(llm.get("retry_wait_s", 2.0)))


@dataclass
class ChatLLM:
    """``complete(messages) -> str`` against the configured endpoint; ``http_client`` is an injectable seam."""

    settings: LLMSettings
    http_client: Any = None
    transcript: list[dict[str, Any]] = field(default_factory=list)

    def _client(self) -> Any:
        import openai

        return openai.OpenAI(base_url=self.settings.base_url, api_key=self.settings.api_key or "EMPTY",
                             timeout=self.settings.timeout_s, max_retries=0, http_client=self.http_client)

    def _once(self, messages: list[dict[str, str]], where: str) -> str:
        import openai

        try:
            resp = self._client().chat.completions.create(model=self.settings.model, messages=messages,
                                                          temperature=self.settings.temperature,
                                                          max_tokens=self.settings.max_tokens)
        except openai.OpenAIError as exc:
            raise LLMError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        choices = getattr(resp, "choices", None)
        if not isinstance(choices, list):  # e.g. an HTML error page or plain text served with HTTP 200
            raise LLMError(f"{where} answered with a body that is not an OpenAI chat completion: {str(resp)[:200]!r}",
                           raw=str(resp))
        message = getattr(choices[0], "message", None) if choices else None
        text = getattr(message, "content", None) or ""
        if not isinstance(text, str) or not text.strip():
            raise LLMError(f"{where} returned an empty answer", raw=str(text))
        return text

    def complete(self, messages: list[dict[str, str]], stage: str = "") -> str:
        """The answer text; up to ``1 + retries`` tries, then one :class:`LLMError` naming the last failure."""
        where = f"LLM call ({stage or 'chat'}) to {self.settings.base_url or 'OpenAI'}"
        wait = self.settings.retry_wait_s
        tries = 1 + max(0, self.settings.retries)
        for i in range(1, tries + 1):
            t0 = time.time()
            try:
                text = self._once(messages, where)
            except LLMError as exc:
                self.transcript.append({"stage": stage, "messages": messages, "error": str(exc), "try": i,
                                        "seconds": round(time.time() - t0, 2)})
                if i == tries:
                    raise LLMError(f"{exc} (gave up after {tries} tries)", raw=exc.raw) from exc
                time.sleep(wait)
                wait *= 2
                continue
            self.transcript.append({"stage": stage, "messages": messages, "answer": text, "try": i,
                                    "seconds": round(time.time() - t0, 2)})
            return text
        raise AssertionError("unreachable")
