"""Training: advantages, losses, the update loop, weight publishing and checkpoints.

Typical flow (``flows/train.py``)::

    items = items_from_steps(leased_steps)              # rewards -> GRPO advantages
    metrics = trainer.update(items)                     # merge + one optimizer step
    version, pub = trainer.publish()                    # peft adapter -> backend, version + 1
    trainer.save_checkpoint(extra={"lease": lease_id})  # then ack the lease

Pure functions (``advantages``, ``losses``) hold the RL math; ``Trainer`` holds the state.
Under torchrun, ``distributed`` makes the update data parallel (rank 0 leads, others ``follow``).
"""

from swarm.train import distributed
from swarm.train.advantages import advantage_stats, assign_credit, group_keys, grpo_advantages
from swarm.train.checkpoint import commit_checkpoint, load_latest_checkpoint
from swarm.train.config import LoraSpec, TrainConfig
from swarm.train.forward import target_logprobs
from swarm.train.ledger import Ledger
from swarm.train.losses import item_token_weights, k3_kl, ppo_clip_loss
from swarm.train.prepare import items_from_steps
from swarm.train.publish import adapter_state, save_adapter
from swarm.train.trainer import Trainer

__all__ = [
    "assign_credit",
    "group_keys",
    "grpo_advantages",
    "advantage_stats",
    "ppo_clip_loss",
    "k3_kl",
    "item_token_weights",
    "target_logprobs",
    "items_from_steps",
    "LoraSpec",
    "TrainConfig",
    "Trainer",
    "Ledger",
    "adapter_state",
    "save_adapter",
    "commit_checkpoint",
    "load_latest_checkpoint",
    "distributed",
]
