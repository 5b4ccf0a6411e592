"""A verifiers harness that runs its chat loop in this process, so a rollout needs no uv bootstrap.

verifiers' built-in tool-less harness (``null``) launches a PEP 723 script through ``uv sync --script``,
which installs ``uv`` and the script's dependencies from the network at the first rollout. This one
does what that script does for a prompt without tools, with the libraries already here: it sends the
task's (system) prompt to the endpoint verifiers hands it (its interception server, which relays the
call to the client verifiers was given: our gateway with the episode's key) and returns the reply.
The interception server records the call on the trace, so the task's rubric scores it as usual.
Loaded by verifiers as harness id ``experiments.verifiers.harness`` (its class is in ``__all__``).
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf
from verifiers.v1.runtimes import ProgramResult

__all__ = ["InProcessChatHarness"]

HARNESS_ID = "experiments.verifiers.harness"


class InProcessChatHarnessConfig(vf.HarnessConfig):
    """No knobs: the sampling comes from the rollout's model context."""


class InProcessChatHarness(vf.Harness[InProcessChatHarnessConfig]):
    """One chat call per launch, in-process, through the rollout's interception endpoint."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str, mcp_urls: dict[str, str],
                     data: Any, tool_interception_url: str | None = None) -> ProgramResult:
        import openai

        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(exclude_none=True) if hasattr(m, "model_dump") else dict(m) for m in prompt or []]
        client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            resp = await client.chat.completions.create(model=ctx.model, messages=messages)
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout=resp.choices[0].message.content or "", stderr="")
