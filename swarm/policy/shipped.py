"""The tiny checkpoints that ship in the repository, checked against their sha256 whenever they load.

Why bytes and not a build: the warm-ups train the tiny model with float matmuls whose rounding
depends on the CPU's vector instructions, so a warm-up built on one machine is not the one built
on another. Measured with ``python tools/tiny_checkpoints.py cpu-check`` (one machine, torch's three
kernel sets via ``ATEN_CPU_CAPABILITY``): the word-chain warm-up gave three different sets of weights
for avx512, avx2 and default (1 and 2 threads agreed), and such differences grow: the reading
warm-up copied the asked number in 0.65 of held-out chats on one machine's build and 0.42 on
another's. The models that tests and CPU defaults depend on are therefore built once
(``python tools/tiny_checkpoints.py build``) and shipped in ``checkpoints/`` with a sha256 per file
in ``checkpoints/manifest.json``. Models without a warm-up are not shipped: their initialisation is
integer-exact (:func:`swarm.policy.tiny.exact_normal_`) and so the same bytes on every machine.

:func:`install` copies a shipped checkpoint into the model cache, checking every file against the
manifest when it copies and again each time the cached copy is asked for; a cached copy that differs
(a local build, an edit) is replaced, and a shipped file that differs raises
:class:`~swarm.errors.ChecksumError`. Not here: building models (``tiny.py``), downloading anything.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

from swarm.errors import ChecksumError

__all__ = ["SHIPPED_DIR", "MANIFEST", "SHIPPED_WARMUPS", "cpu_kernel_sets", "manifest", "shipped_entry", "sha256_file", "file_digests",
           "mismatches", "install", "ship", "quality"]

log = logging.getLogger(__name__)
SHIPPED_DIR = Path(__file__).parent / "checkpoints"
MANIFEST = SHIPPED_DIR / "manifest.json"
SHIPPED_WARMUPS = ("word_chain", "reading")  # at seed 0 with the default TinySpec: what tests and CPU defaults load


def cpu_kernel_sets() -> list[str]:
    """torch's CPU kernel sets (``ATEN_CPU_CAPABILITY`` values) this CPU can run, best first: forcing
    ``avx512`` on a CPU without AVX-512 kills the process with SIGILL."""
    import torch

    order = ["avx512", "avx2", "default"]
    best = torch.backends.cpu.get_cpu_capability().lower()  # "avx512", "avx2" or "default" on x86_64
    return order[order.index(best):] if best in order else ["default"]


@lru_cache(maxsize=1)
def manifest() -> dict[str, dict[str, Any]]:
    """Folder name -> ``{"key", "files": {name: sha256}, "built_on", ...}`` of every shipped checkpoint."""
    return json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}


def shipped_entry(name: str) -> dict[str, Any] | None:
    """The manifest entry of the checkpoint folder ``name``, or None when it does not ship."""
    return manifest().get(name)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (a real model's weights are GBs)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_digests(folder: Path) -> dict[str, str]:
    """sha256 of every plain file in ``folder`` (not recursive), by file name."""
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()}


def mismatches(folder: Path, files: dict[str, str]) -> list[str]:
    """The names in ``files`` that are missing from ``folder`` or whose sha256 differs."""
    bad = []
    for name, digest in files.items():
        p = folder / name
        if not p.is_file() or sha256_file(p) != digest:
            bad.append(name)
    return bad


def install(name: str, cache: Path) -> Path:
    """``cache/name``: the shipped checkpoint ``name``, copied there if absent or different, and verified."""
    entry = shipped_entry(name)
    if entry is None:
        raise KeyError(f"{name} is not a shipped checkpoint (see {MANIFEST})")
    final = cache / name
    if final.exists():
        bad = mismatches(final, entry["files"])
        if not bad:
            return final
        log.warning("%s differs from the shipped checkpoint in %s (a local build or an edit): replacing it",
                    final, ", ".join(bad))
        stale = Path(tempfile.mkdtemp(prefix=".build-stale-", dir=cache))
        try:
            os.rename(final, stale / name)
        except FileNotFoundError:  # another process replaced it first
            pass
        shutil.rmtree(stale, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        for fname in entry["files"]:
            shutil.copyfile(SHIPPED_DIR / name / fname, tmp / fname)
        bad = mismatches(tmp, entry["files"])
        if bad:
            raise ChecksumError(f"the shipped checkpoint {SHIPPED_DIR / name} does not match {MANIFEST.name} in "
                                f"{', '.join(bad)}: a corrupt checkout (git LFS pointer, partial copy)? "
                                "`git checkout -- swarm/policy/checkpoints` restores it", checkpoint=name)
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished first: keep theirs if it is right
            if mismatches(final, entry["files"]):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def ship(folder: Path, **info: Any) -> dict[str, Any]:
    """Copy a freshly built checkpoint ``folder`` into :data:`SHIPPED_DIR` and record its checksums (and
    ``info``: what it was built on, its measured quality) in the manifest; returns the entry."""
    dest = SHIPPED_DIR / folder.name
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(folder, dest)
    dest.chmod(0o755)  # the build folder came from mkdtemp (0700)
    for p in dest.iterdir():
        p.chmod(0o644)
    key = json.loads((dest / "swarm_tiny.json").read_text())
    entry = {"key": {k: key[k] for k in sorted(key) if k != "build_s"}, "files": file_digests(dest), **info}
    entries = dict(manifest())
    entries[folder.name] = entry
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    manifest.cache_clear()
    return entry


def quality(folder: Path, warmup: str) -> dict[str, float]:
    """What a warm-up taught, measured on held-out data (never trained on): ``word_chain_loss`` (mean
    cross-entropy per reply token of 512 word-chain chats) and, for ``reading``, ``copy_accuracy``
    (and its ``copy_chance``) on 300 label-copy chats. Compares two builds of one checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from swarm.policy.warmup import chat_rows, reply_loss, warmup_chats

    tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder).eval()
    rows = chat_rows(tok, [([{"role": "user", "content": u}], r) for u, r in warmup_chats(512, seed=999)])
    out = {"word_chain_loss": round(reply_loss(model, rows, tok.pad_token_id), 4)}
    if warmup == "reading":
        from swarm.policy.copy_warmup import copy_accuracy

        acc, chance = copy_accuracy(model, tok)
        out |= {"copy_accuracy": round(acc, 4), "copy_chance": round(chance, 4)}
    return out
