"""Atomic trainer checkpoints: a directory per committed update and a LATEST pointer.

A checkpoint (a dict: trainable weights, optimizer, update count, versions, RNG, the caller's
``extra``) is written to a temp directory, fsynced, renamed to ``ckpt-<update>`` and only then
named in ``LATEST`` (``os.replace``): a crash at any point leaves the previous one loadable. Older
checkpoints beyond ``keep`` are removed after the commit. It does not know what a trainer is.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["commit_checkpoint", "load_latest_checkpoint"]

_STATE = "state.pt"
_LATEST = "LATEST"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_checkpoint(root: str | Path, update: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``state`` as checkpoint ``update`` under ``root`` and point LATEST at it."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"ckpt-{update:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        with open(tmp / _STATE, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(root)
        latest_tmp = root / f".{_LATEST}.tmp"
        with open(latest_tmp, "w") as f:
            f.write(name)
            f.flush()
            os.fsync(f.fileno())
        os.replace(latest_tmp, root / _LATEST)
        _fsync_dir(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in sorted(p for p in root.glob("ckpt-*") if p.is_dir())[:-keep]:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest_checkpoint(root: str | Path) -> dict[str, Any] | None:
    """The state LATEST names, or None when no checkpoint was ever committed."""
    root = Path(root)
    latest = root / _LATEST
    if not latest.exists():
        return None
    path = root / latest.read_text().strip() / _STATE
    with open(path, "rb") as f:
        return torch.load(f, map_location="cpu", weights_only=False)
