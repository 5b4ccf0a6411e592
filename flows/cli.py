"""What the entry points' command lines share (``flows.train``, ``flows.eval``): the one-line config error
and the check that names a mistyped dotted key with the close one before Hydra composes.

It composes nothing it keeps and imports nothing heavy: both run before torch, Prefect or MLflow load.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from pydantic import BaseModel

from flows.config import RunConfig
from swarm.explain import section_keys, unknown_key_hint

__all__ = ["CONF", "fail", "check_overrides"]

CONF = Path(__file__).resolve().parents[1] / "conf"


def fail(message: str) -> NoReturn:
    """``config error: <message>`` on stderr, exit 2."""
    print(f"config error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def check_overrides(config_name: str, overrides: list[str], schema: type[BaseModel] = RunConfig,
                    add_hint: bool = False) -> None:
    """Name a mistyped key (``eval.vesion=1``) with the close one from ``schema``'s types (Hydra alone suggests
    ``+key=...``); ``add_hint`` also says how a new key is added. Hydra's other messages are left to hydra.main."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        try:
            compose(config_name=config_name, overrides=overrides)
            return
        except ConfigCompositionException as exc:
            if not str(exc).startswith("Could not override"):
                return  # Hydra's own message (missing group option, ...) follows from hydra.main
            key = str(exc).split("'")[1]
    section, _, leaf = key.rpartition(".")
    hint = unknown_key_hint(leaf, section_keys(key, schema), cutoff=0.6, section=section)
    if add_hint:
        value = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key), "...")
        hint += f"; a new key is added with +{key}={value}"
    fail(f"{key}: no such config key{hint}")
