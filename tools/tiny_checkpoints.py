"""The shipped tiny checkpoints: print their checksums, rebuild them, check a rebuild against them.

    python tools/tiny_checkpoints.py checksums        # sha256 of each shipped model and of its cached copy
    python tools/tiny_checkpoints.py check [NAME]     # rebuild here (temp dir) and compare with the shipped bytes
    python tools/tiny_checkpoints.py cpu-check        # `check` under torch's avx512 / avx2 / default CPU kernels
    python tools/tiny_checkpoints.py build            # rebuild every shipped model and ship it (maintainers)

NAME is a warm-up of ``swarm.policy.shipped.SHIPPED_WARMUPS`` (word_chain, reading). ``check`` prints
one JSON line per model: identical bytes or not, the largest weight difference, and the held-out
quality of the rebuild beside the shipped one's (``swarm.policy.shipped.quality``). Builds run on one
torch thread (1 and 2 threads gave the same bytes; the CPU's instruction set did not).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _build(warmup: str, cache: Path) -> Path:
    import torch

    from swarm.policy.tiny import ensure_tiny_model
    from swarm.policy.warmup import get_warmup

    torch.set_num_threads(1)
    return ensure_tiny_model(cache_dir=cache, seed=0, warmup=get_warmup(warmup), rebuild=True)


def _machine() -> str:
    import torch

    return (f"{platform.machine()} {torch.backends.cpu.get_cpu_capability()} kernels, 1 torch thread, "
            f"torch {torch.__version__}, {os.cpu_count()} cores")


def checksums() -> None:
    """One line per shipped model: folder, warm-up, sha256 of its weights, and whether the cache holds it intact."""
    from swarm.policy.shipped import manifest, mismatches
    from swarm.policy.tiny import default_cache_dir

    for name, entry in manifest().items():
        cached = default_cache_dir() / name
        state = ("cache intact" if not mismatches(cached, entry["files"]) else "cache differs (replaced at next load)"
                 ) if cached.exists() else "not in the cache yet"
        print(f"{name}  warmup={entry['key']['warmup']}  model.safetensors sha256={entry['files']['model.safetensors']}"
              f"  ({state}: {cached})")


def check(warmups: list[str]) -> list[dict]:
    """Rebuild each model in a temp dir and compare with the shipped one; a JSON line each."""
    from safetensors.torch import load_file

    from swarm.policy.shipped import SHIPPED_DIR, file_digests, manifest, quality

    out = []
    for warmup in warmups:
        with tempfile.TemporaryDirectory() as tmp:
            built = _build(warmup, Path(tmp))
            entry = manifest().get(built.name)
            if entry is None:
                raise SystemExit(f"{built.name} ({warmup}) is not shipped: run `build` first")
            a, b = load_file(built / "model.safetensors"), load_file(SHIPPED_DIR / built.name / "model.safetensors")
            row = {"name": built.name, "warmup": warmup, "machine": _machine(),
                   "identical": file_digests(built)["model.safetensors"] == entry["files"]["model.safetensors"],
                   "max_abs_weight_diff": max(float((a[k] - b[k]).abs().max()) for k in a),
                   "rebuild": quality(built, warmup), "shipped": entry.get("quality")}
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def cpu_check(warmups: list[str]) -> None:
    """``check`` in a subprocess per torch CPU kernel set this CPU can run (ATEN_CPU_CAPABILITY)."""
    from swarm.policy.shipped import cpu_kernel_sets

    for cap in cpu_kernel_sets():
        env = {**os.environ, "ATEN_CPU_CAPABILITY": cap}
        subprocess.run([sys.executable, __file__, "check", *warmups], env=env, check=True)


def build() -> None:
    """Rebuild every shipped model from scratch and ship it (new bytes and checksums in the manifest)."""
    from swarm.policy.shipped import SHIPPED_WARMUPS, quality, ship

    with tempfile.TemporaryDirectory() as tmp:
        for warmup in SHIPPED_WARMUPS:
            built = _build(warmup, Path(tmp))
            entry = ship(built, warmup=warmup, built_on=_machine(), quality=quality(built, warmup))
            print(f"shipped {built.name} ({warmup}): {json.dumps(entry['quality'])}", flush=True)


def main() -> None:
    from swarm.policy.shipped import SHIPPED_WARMUPS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["checksums", "check", "cpu-check", "build"])
    ap.add_argument("names", nargs="*", help=f"warm-ups to check (default: {' '.join(SHIPPED_WARMUPS)})")
    a = ap.parse_args()
    names = a.names or list(SHIPPED_WARMUPS)
    bad = sorted(set(names) - set(SHIPPED_WARMUPS))
    if bad:
        ap.error(f"{bad[0]} is not shipped; choose from {', '.join(SHIPPED_WARMUPS)}")
    if a.command == "checksums":
        checksums()
    elif a.command == "build":
        build()
    elif a.command == "check":
        check(names)
    else:
        cpu_check(names)


if __name__ == "__main__":
    main()
