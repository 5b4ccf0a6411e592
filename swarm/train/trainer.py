"""The trainer: a model (peft LoRA or full fine-tune), an AdamW optimizer and the policy version.

:meth:`Trainer.update` is one optimizer step on a list of :class:`~swarm.merge.TrainSeq`: merge
(``none`` / ``timeline`` / ``tree``), micro-batches within the token budget, PPO-clip (+ optional k3
KL to the adapter-disabled base) with weights fixed over the whole batch, so accumulation equals
the full-batch gradient (``swarm.train.batch_loss``); then clipping and the step. The same forward gives the
train-inference mismatch of the steps sampled at :attr:`Trainer.version` (``mismatch/`` metrics,
``swarm.train.mismatch``): the recorded logprobs against this recompute, at no extra forward. :meth:`Trainer.publish`
saves the peft adapter, calls the backend's ``load_weights(policy, state, version)``, bumps the
version; :meth:`Trainer.save_checkpoint` / :meth:`Trainer.resume` make it restartable. Under torchrun
the update is data parallel (``swarm.train.distributed``); only rank 0 writes or calls the backend.
Version numbers: the counter starts at the backend's served version (or ``version=``), is restored by
:meth:`Trainer.resume`, and only :meth:`Trainer.publish` assigns a new one.
It does not lease, settle, compute advantages or log (``swarm.update`` and the flow do).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from swarm.errors import ValidationError
from swarm.merge import Collated, TrainSeq, collate, merge_items, micro_batches
from swarm.merge.layout import PackedRow
from swarm.records import PolicyVersion
from swarm.train import distributed
from swarm.train.advantages import advantage_stats
from swarm.train.batch_loss import BatchWeights, LossSums, MicroLoss, batch_weights, micro_batch_loss
from swarm.train.checkpoint import commit_checkpoint, load_latest_checkpoint
from swarm.train.config import TrainConfig
from swarm.train.constraint import ConstraintReplay, target_allowed
from swarm.train.flex_mask import check_flex_device, use_flex_attention
from swarm.train.forward import base_causal_lm, target_logprobs
from swarm.train.mismatch import MismatchSums
from swarm.train.publish import adapter_state, is_peft, save_adapter

__all__ = ["Trainer"]


class Trainer:
    """One policy's trainer. ``backend`` is anything with ``load_weights(policy, state, version)``.

    ``device`` moves the model (and ``ref_model``) there (None: where they are). ``tokenizer`` (HF
    tokenizer or path; default the backend's) replays constrained steps' grammars, so they are scored
    under their sampling masks. Under torch.distributed the trainable weights start as rank 0's. With
    ``config.attention == "flex"`` the model (a shared base: every policy on it) switches for good.
    """

    def __init__(self, model: torch.nn.Module, config: TrainConfig | None = None, *, policy: str = "default",
                 backend: Any = None, out_dir: str | Path | None = None, ref_model: torch.nn.Module | None = None,
                 version: int | None = None, device: str | torch.device | None = None, tokenizer: Any = None) -> None:
        self.config = config or TrainConfig()
        tokenizer = tokenizer if tokenizer is not None else getattr(backend, "tokenizer", None)
        self.constraints = None if tokenizer is None else ConstraintReplay(tokenizer)
        self.policy = policy
        self.backend = backend
        self.out_dir = Path(out_dir) if out_dir is not None else None
        if self.config.lora is not None and not is_peft(model):
            from peft import get_peft_model

            model = get_peft_model(model, self.config.lora.peft())
        if device is not None:
            model = model.to(device)
            ref_model = None if ref_model is None else ref_model.to(device)
        self.model = model
        self.ref_model = ref_model
        if self.config.attention == "flex":
            self._use_flex()
        if self.config.kl_coef > 0 and not is_peft(model) and ref_model is None:
            raise ValidationError("train.kl_coef > 0 with full fine-tuning needs a ref_model (or use lora)")
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValidationError("the model has no trainable parameters")
        distributed.broadcast_params(params)  # e.g. LoRA's random init: rank 0's everywhere
        self.optimizer = torch.optim.AdamW(params, lr=self.config.lr, betas=self.config.betas,
                                           weight_decay=self.config.weight_decay)
        if version is None:
            version = backend.version(policy) if backend is not None and hasattr(backend, "version") else 0
        self.version = int(version)
        self.updates = 0

    @classmethod
    def from_pretrained(cls, model_path: str | Path, config: TrainConfig | None = None,
                        device: str | torch.device = "cpu", **kwargs: Any) -> Trainer:
        """Load a local causal LM in fp32 onto ``device`` (no downloads when HF_HUB_OFFLINE is set)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        kwargs.setdefault("tokenizer", str(model_path))
        return cls(model, config, device=device, **kwargs)

    # -- the update ---------------------------------------------------------------------------

    def update(self, items: list[TrainSeq]) -> dict[str, float]:
        """One optimizer step on ``items``; returns the metrics dict (``train/``, ``merge/``, ``adv/``, ``time/``)."""
        t0 = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        metrics = self.accumulate_gradients(items)
        t4 = time.perf_counter()
        params = [p for p in self.model.parameters() if p.requires_grad]
        distributed.all_reduce_grads(params)  # sum of the ranks' shares = the full-batch gradient
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if metrics["train/tokens"] > 0:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.updates += 1
        metrics["train/grad_norm"] = float(grad_norm)
        metrics["train/updates"] = float(self.updates)
        metrics["time/optimizer_s"] = time.perf_counter() - t4
        metrics["time/update_s"] = time.perf_counter() - t0
        return metrics

    def accumulate_gradients(self, items: list[TrainSeq]) -> dict[str, float]:
        """Merge, forward and backward every micro-batch, adding the batch gradient to ``.grad``.

        No optimizer step, no zeroing: the gradient equals that of the whole batch's loss.
        Under torch.distributed only this rank's share of the micro-batches is run (its
        gradient is a part of the sum; ``update`` all-reduces it); the metrics cover all ranks.
        """
        cfg = self.config
        t0 = time.perf_counter()
        batch = merge_items(items, cfg.merge, cfg.token_budget)
        t_merge = time.perf_counter() - t0
        dev = next(self.model.parameters()).device
        weights = batch_weights(items, batch.rows, cfg.loss_agg, dev, version=self.version)
        masks = self._constraint_masks(items)
        self.model.train()
        sums, mism, t_fwd, t_bwd = LossSums(), MismatchSums(), 0.0, 0.0
        for col in self._micro_batches(batch.rows):
            t1 = time.perf_counter()
            part = self._micro_batch_loss(col, weights, masks)
            t2 = time.perf_counter()
            part.loss.backward()
            t_fwd += t2 - t1
            t_bwd += time.perf_counter() - t2
            sums.add(part)
            if part.mismatch is not None:
                mism.add(part.mismatch)
        sums = LossSums.from_dict(distributed.all_reduce_sums(sums.as_dict(), dev))
        mism = MismatchSums.from_dict({**distributed.all_reduce_sums(mism.sums(), dev),
                                       **distributed.all_reduce_max(mism.maxes(), dev)})
        metrics = sums.metrics(with_kl=cfg.kl_coef > 0)
        metrics.update(mism.metrics())
        metrics.update({"train/tokens_forward": float(batch.stats.tokens_after), "time/merge_s": t_merge,
                        "time/forward_s": t_fwd, "time/backward_s": t_bwd})
        metrics.update(batch.stats.as_metrics())
        metrics.update(advantage_stats([it.advantage for it in items]))
        return metrics

    def _use_flex(self) -> None:
        """Switch the model (and ref model) to flex attention; refuse a CPU model (no flex backward there)."""
        models = [m for m in (self.model, self.ref_model) if m is not None]
        check_flex_device(next(self.model.parameters()).device, needs_grad=True)
        for m in models:
            use_flex_attention(base_causal_lm(m))

    def _micro_batches(self, rows: list[PackedRow]) -> Iterator[Collated]:
        """This rank's micro-batches of ``rows`` within the token budget, collated; empty ones skipped."""
        dense = self.config.attention == "dense"
        for group in distributed.shard(micro_batches(rows, self.config.token_budget)):
            col = collate([rows[i] for i in group], pad_id=self.config.pad_id, dense_mask=dense)
            if col.target_ids.numel() > 0:
                yield col

    def _micro_batch_loss(self, col: Collated, weights: BatchWeights, masks: dict[int, torch.Tensor]) -> MicroLoss:
        """Forward one micro-batch (and the reference, with a KL term) and take its loss."""
        cfg = self.config
        allowed = target_allowed(masks, col)
        logp, ent = target_logprobs(self.model, col, cfg.temperature, with_entropy=True, allowed=allowed)
        ref = self._ref_logprobs(col, allowed) if cfg.kl_coef > 0 else None
        return micro_batch_loss(logp, ent, col, weights, cfg, ref)

    def _constraint_masks(self, items: list[TrainSeq]) -> dict[int, torch.Tensor]:
        if all(it.constraint is None for it in items):
            return {}
        if self.constraints is None:
            raise ValidationError("constrained steps need the tokenizer to replay their grammar: pass tokenizer=")
        return self.constraints.item_masks(items)

    def _ref_logprobs(self, col, allowed=None) -> torch.Tensor:
        with torch.no_grad():
            if self.ref_model is not None:
                return target_logprobs(self.ref_model, col, self.config.temperature, allowed=allowed)[0]
            with self.model.disable_adapter():
                return target_logprobs(self.model, col, self.config.temperature, allowed=allowed)[0]

    # -- publishing ---------------------------------------------------------------------------

    def publish(self, save: bool = True, after: int | None = None) -> tuple[PolicyVersion, dict[str, float]]:
        """Save (when ``out_dir`` is set and ``save``), load into the backend, take the next version: the one
        place a version number is assigned (``version + 1``; ``after + 1`` when given: a restart past the
        pool's newest version, a torchrun follower taking rank 0's). Under torch.distributed only rank 0
        saves and loads (the record names the path rank 0 wrote). The pool learns of it through
        :meth:`swarm.train.Ledger.publish`."""
        t0 = time.perf_counter()
        version = (self.version if after is None else int(after)) + 1
        path = None
        if self.out_dir is not None and save:
            path = self.out_dir / "adapters" / self.policy / f"v{version:06d}"
            if distributed.is_main():
                path = save_adapter(self.model, path, policy=self.policy, version=version)
        if self.backend is not None and distributed.is_main():
            self.backend.load_weights(self.policy, adapter_state(self.model), version)
        self.version = version
        record = PolicyVersion(policy=self.policy, version=version, adapter_path=None if path is None else str(path))
        return record, {"time/publish_s": time.perf_counter() - t0, "policy/version": float(version)}

    # -- checkpoint / resume ------------------------------------------------------------------

    def save_checkpoint(self, root: str | Path | None = None, extra: dict[str, Any] | None = None) -> Path:
        """Commit trainable weights, optimizer, versions and ``extra`` atomically; under torch.distributed
        only rank 0 writes (every rank holds the same state), the others return its path."""
        root = self._ckpt_root(root)
        if not distributed.is_main():
            return root / f"ckpt-{self.updates:08d}"
        trainable = {n: p.detach().cpu().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        state = {"updates": self.updates, "policy": self.policy, "version": self.version, "trainable": trainable,
                 "optimizer": self.optimizer.state_dict(), "rng": torch.get_rng_state(), "extra": dict(extra or {})}
        return commit_checkpoint(root, self.updates, state)

    def resume(self, root: str | Path | None = None) -> dict[str, Any] | None:
        """Restore the last committed checkpoint; returns its ``extra`` (None: nothing to resume)."""
        state = load_latest_checkpoint(self._ckpt_root(root))
        if state is None:
            return None
        named = dict(self.model.named_parameters())
        missing = [n for n in state["trainable"] if n not in named]
        if missing:
            raise ValidationError(f"checkpoint does not match the model: unknown parameters {missing[:3]}")
        with torch.no_grad():
            for n, t in state["trainable"].items():
                named[n].copy_(t)
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        self.updates = state["updates"]
        self.version = state["version"]
        return state["extra"]

    def _ckpt_root(self, root: str | Path | None) -> Path:
        if root is not None:
            return Path(root)
        if self.out_dir is None:
            raise ValidationError("no checkpoint directory: pass root or construct the Trainer with out_dir")
        return self.out_dir / "checkpoints" / self.policy
