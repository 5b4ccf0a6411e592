"""Module ids that verifiers' plugin loader can import, for the adapter's tasksets and harness.

The loader imports a plugin id ``x`` as ``verifiers.v1.<group>.x`` when that exists, else as ``x``; it
cannot take a dotted path. Nothing else lives here, so the harness and the rollout both use it without
importing each other.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["HARNESS_ID", "plugin_id"]

HARNESS_ID = "experiments.verifiers.harness"


def plugin_id(module: str) -> str:
    """An id verifiers' plugin loader can import: a dotted module path is aliased as one top-level name.

    The loader first looks for ``verifiers.v1.tasksets.<id>``, and ``importlib.util.find_spec`` raises on a
    dotted id whose first part is not a package there; a top-level name (an installed environment) is
    used as is.
    """
    if "." not in module:
        return module
    alias = module.replace(".", "__").lower()
    sys.modules.setdefault(alias, importlib.import_module(module))
    return alias
