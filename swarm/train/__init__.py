"""Training: advantages, losses, the update loop, weight publishing and checkpoints.

One update (in full: :func:`swarm.update.run_update`, which the flow, ``flows/run.py``, runs; a script runs
N of them with :func:`swarm.update.run_updates`)::

    rewards = rated_rewards(...)                        # human ratings by the rule (feedback)
    items = items_from_steps(leased_steps)              # rewards -> GRPO advantages
    items += correction_items(...)                      # human corrections, supervised
    metrics = trainer.update(items)                     # merge + one optimizer step
    ledger.publish()                                    # adapter -> backend, version + 1 -> pool
    ledger.trained(lease_id, step_ids)                  # pending until the next checkpoint
    ledger.commit()                                     # checkpoint, then the ledger settles the leases

Pure functions (``advantages``, ``losses``) hold the RL math; ``Trainer`` holds the state, and its
``publish`` is the one place a policy version number is assigned (``Ledger.publish`` records it in the pool).
Under torchrun, ``distributed`` makes the update data parallel (rank 0 leads, others ``swarm.update.follow``).
"""

from __future__ import annotations

import importlib
from typing import Any

from swarm.train.config import LoraSpec, TrainConfig

# name -> module; imported on first use, so reading a TrainConfig (the CLI's fail-fast check) costs no torch
_LAZY = {
    **dict.fromkeys(("advantage_stats", "assign_credit", "group_keys", "grpo_advantages"), "swarm.train.advantages"),
    **dict.fromkeys(("commit_checkpoint", "load_latest_checkpoint"), "swarm.train.checkpoint"),
    "target_logprobs": "swarm.train.forward",
    "Ledger": "swarm.train.ledger",
    **dict.fromkeys(("item_token_weights", "k3_kl", "ppo_clip_loss"), "swarm.train.losses"),
    "items_from_steps": "swarm.train.prepare",
    **dict.fromkeys(("adapter_state", "save_adapter"), "swarm.train.publish"),
    "Trainer": "swarm.train.trainer",
    **dict.fromkeys(("RatingRule", "rating_reward", "step_ratings", "rated_rewards", "fill_rewards",
                     "correction_items"), "swarm.train.feedback"),
}

__all__ = ["assign_credit", "group_keys", "grpo_advantages", "advantage_stats", "ppo_clip_loss", "k3_kl",
           "item_token_weights", "target_logprobs", "items_from_steps", "LoraSpec", "TrainConfig", "Trainer", "Ledger",
           "adapter_state", "save_adapter", "commit_checkpoint", "load_latest_checkpoint", "distributed",
           "RatingRule", "rating_reward", "step_ratings", "rated_rewards", "fill_rewards", "correction_items"]


def __getattr__(name: str) -> Any:
    if name == "distributed":
        return importlib.import_module("swarm.train.distributed")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'swarm.train' has no attribute {name!r}")
