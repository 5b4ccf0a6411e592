"""``python -m flows.export SOURCE [--version N] [--policy P] [--out DIR]``: take a trained version out.

SOURCE is what ``flows.train`` wrote: a run folder (``train.out_dir``; ``--version N`` picks
``adapters/<policy>/v<N>``, default its newest), one adapter folder (``adapters/<policy>/v<N>``) or a trainer
checkpoint (``checkpoints/<policy>`` or ``.../ckpt-N``: the adapter its commit kept), located as
``flows.eval`` locates ``eval.checkpoint`` (:func:`flows.eval.resolve_target`). Written under ``--out``
(default ``exports/<policy>-v<N>``)::

    merged/    base + LoRA merged (peft ``merge_and_unload``): config.json, model.safetensors,
               generation_config.json, the tokenizer and its chat template: ``vllm serve DIR/merged`` and
               ``AutoModelForCausalLM.from_pretrained(DIR/merged)`` load it as it is
    adapter/   the adapter folder as training saved it (peft format: adapter_config.json +
               adapter_model.safetensors, swarm_version.json), for ``--lora-modules`` / ``PeftModel``
    export.json  what was exported: policy, version, source, base, dtype, chat template

The base model is ``--base`` (an HF id or folder), else the adapter's ``base_model_name_or_path`` (the folder the
trainer loaded: the tiny model's or the converted SmolLM2's cache folder, a ``model.path``). The tokenizer and chat
template are the base's; a run that served another template (``model.chat_template``) passes the same with
``--chat-template`` (a template name or a Jinja file). ``--dtype bfloat16`` writes GPU-sized weights (the merge
itself is float32). A full fine-tune's folder (no adapter_config.json) is already whole: merged/ is it plus the
base's tokenizer. A tied ``lm_head`` stays tied when no adapter touches it.

Checked here: the merged folder's logprobs equal the trainer's peft model's within 1e-4 (transformers, fp32;
tests/flows/test_export.py) and a real vLLM serving it records the trainer's logprobs within 1e-3 nats/token
(tests/policy/test_vllm_export.py). Not done: quantising, pushing to a hub, merging several policies into one.
Exit 2 with one ``export error:`` line when SOURCE does not hold what was asked.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from swarm.errors import ConfigError

__all__ = ["locate", "export", "main"]


def _kept(adapters: Path) -> list[int]:
    return sorted(int(p.name[1:]) for p in adapters.glob("v*") if p.name[1:].isdigit() and p.is_dir())


def locate(source: str | Path, policy: str | None = None, version: int | None = None) -> tuple[str, int, Path]:
    """``(policy, version, weights folder)`` of SOURCE (see the module docstring); ConfigError saying what is there."""
    from flows.config import EvalSection
    from flows.eval import resolve_target

    path = Path(source).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{path}: no such folder")
    if (path / "adapters").is_dir() or (path / "checkpoints").is_dir():  # a run folder
        if policy is None:
            policies = sorted(p.name for p in (path / "adapters").iterdir() if p.is_dir()) \
                if (path / "adapters").is_dir() else []
            if len(policies) > 1:
                raise ConfigError(f"{path} holds policies {policies}: pass --policy")
            policy = policies[0] if policies else "default"
        kept = _kept(path / "adapters" / policy)
        if not kept:
            raise ConfigError(f"{path}: no adapter of policy {policy!r} (adapters/{policy}/v<N>); a run keeps one "
                              "at each checkpoint (train.checkpoint_every)")
        v = kept[-1] if version is None else int(version)
        if v not in kept:
            raise ConfigError(f"{path}: version {v} of {policy!r} kept no adapter. Checkpoints keep adapters: "
                              f"train.checkpoint_every=k keeps every k-th version's (1: every version's); versions "
                              f"of {policy!r} with an adapter: {kept}")
        path = path / "adapters" / policy / f"v{v:06d}"
    try:  # an adapter or checkpoint folder: where flows.eval finds eval.checkpoint's weights
        info = json.loads((path / "swarm_version.json").read_text()) if (path / "swarm_version.json").is_file() else {}
        want = policy or str(info.get("policy") or "default")
        target = resolve_target(None, EvalSection(checkpoint=str(path), policy=want))  # type: ignore[arg-type]
    except ConfigError as exc:
        raise ConfigError(str(exc).replace(f"eval.checkpoint={path}", str(path))
                          .replace("set eval.policy=", "pass --policy ")) from None
    except ValueError as exc:  # a checkpoint of another policy than --policy: EvalSection's own check
        raise ConfigError(f"{path}: {exc}") from None
    if version is not None and target.version != version:
        raise ConfigError(f"{target.weights} holds version {target.version}, not --version {version}")
    assert target.weights is not None
    return target.policy, target.version, target.weights


def _base_of(weights: Path, base: str | None) -> str:
    if base is not None:
        return base
    cfg = weights / "adapter_config.json"
    named = json.loads(cfg.read_text()).get("base_model_name_or_path") if cfg.is_file() else None
    if not named:
        raise ConfigError(f"{weights}: its adapter_config.json names no base model; pass --base <folder or HF id>")
    if named.startswith(("/", ".", "~")) and not Path(named).expanduser().is_dir():
        raise ConfigError(f"{weights} was trained on {named}, which is not on this machine: pass --base <that "
                          "model's folder or HF id>")
    return named


def export(weights: Path, out: Path, *, policy: str, version: int, base: str | None = None, dtype: str = "float32",
           chat_template: str | None = None, source: str = "") -> Path:
    """Write ``out/merged``, ``out/adapter`` and ``out/export.json`` for the adapter (or full model) ``weights``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    full = not (weights / "adapter_config.json").is_file()
    base_name = _base_of(weights, base) if not full or base is not None else None
    tok_from = base_name or str(weights)
    if full and not (Path(tok_from) / "tokenizer_config.json").is_file() and base is None:
        raise ConfigError(f"{weights} is a full fine-tune without a tokenizer: pass --base <the base model> for it")
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ConfigError(f"--dtype {dtype}: not a torch dtype (float32, bfloat16, float16)")
    if full:
        model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32)
    else:
        from peft import PeftModel

        model = AutoModelForCausalLM.from_pretrained(base_name, dtype=torch.float32)
        model = PeftModel.from_pretrained(model, str(weights)).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(tok_from)
    if chat_template is not None:
        from swarm.policy.tiny import load_template

        tokenizer.chat_template = Path(chat_template).read_text() if Path(chat_template).is_file() \
            else load_template(chat_template)
    out = Path(out)
    merged, adapter = out / "merged", out / "adapter"
    for d in (merged, adapter):
        if d.exists():
            shutil.rmtree(d)
    model.to(torch_dtype).save_pretrained(str(merged))
    tokenizer.save_pretrained(str(merged))
    shutil.copytree(weights, adapter)
    info = {"policy": policy, "version": version, "source": source or str(weights), "weights": str(weights),
            "base": base_name, "dtype": dtype, "full_fine_tune": full,
            "chat_template": chat_template or "the base's", "merged": str(merged), "adapter": str(adapter)}
    (out / "export.json").write_text(json.dumps(info, indent=1, sort_keys=True))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flows.export", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source", help="a run folder, an adapter folder (adapters/<policy>/v<N>) or a checkpoint folder")
    ap.add_argument("--version", type=int, default=None, help="the version (a run folder: default its newest)")
    ap.add_argument("--policy", default=None, help="the policy (default: the run's only one, or 'default')")
    ap.add_argument("--out", default=None, help="where to write (default exports/<policy>-v<N>)")
    ap.add_argument("--base", default=None, help="the base model (default: the adapter's base_model_name_or_path)")
    ap.add_argument("--dtype", default="float32", help="the merged weights' dtype (float32, bfloat16, float16)")
    ap.add_argument("--chat-template", default=None, help="a template name or Jinja file (default: the base's)")
    args = ap.parse_args(argv)
    try:
        policy, version, weights = locate(args.source, args.policy, args.version)
        out = Path(args.out) if args.out else Path("exports") / f"{policy}-v{version:06d}"
        export(weights, out, policy=policy, version=version, base=args.base, dtype=args.dtype,
               chat_template=args.chat_template, source=str(args.source))
    except ConfigError as exc:
        print(f"export error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(f"exported {policy} v{version} from {weights}\n  merged  {out / 'merged'}   (vllm serve {out / 'merged'})\n"
          f"  adapter {out / 'adapter'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
