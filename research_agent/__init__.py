"""Research agent (A3R): plain-English task descriptions to validated task packages, and campaigns.

Stages of ``python -m research_agent "<description>"`` (each printed and saved under the task
folder): :mod:`~research_agent.spec` (a structured, editable task spec) ->
:mod:`~research_agent.generate` (the package and ``conf/task/<name>.yaml``) ->
:mod:`~research_agent.validate` (run it: sandboxed checks, a dry run through a real gateway) ->
:mod:`~research_agent.repair` (failures back to the LLM, up to N attempts) -> hand over.
A request that a reasoning-gym generator or a TextArena game already fits skips generation:
:mod:`~research_agent.catalog` picks it and configures the ``reasoning_gym`` or ``textarena`` task.
Campaign side: :mod:`~research_agent.sweep` (members of a sweep), :mod:`~research_agent.analysis`
(ranking, plots and a report, no LLM) and :mod:`~research_agent.campaign` (the LLM planner).

Exceptions (:mod:`research_agent.errors`)::

    ResearchAgentError
    ├── LLMNotConfigured      no endpoint/model set; the message says how to set one
    ├── LLMError              the endpoint failed or answered something unusable
    ├── SpecError             a spec is missing fields or has wrong types
    ├── TargetError           the name or --out folder clashes (built-in task, user's file, shadowed module)
    └── CampaignError         a campaign file is invalid (names the key)

A failed validation is a :class:`~research_agent.validate.ValidationReport`, not an exception.
This package imports ``swarm`` only; it runs ``flows`` as subprocesses, never imports them.
"""

from research_agent.errors import (
    CampaignError,
    LLMError,
    LLMNotConfigured,
    ResearchAgentError,
    SpecError,
    TargetError,
)

__all__ = ["ResearchAgentError", "LLMNotConfigured", "LLMError", "SpecError", "CampaignError", "TargetError"]
