"""The LoRA adapter spec shared by the config, the trainer and every backend (one shape, YAML to peft)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from swarm.errors import ValidationError

if TYPE_CHECKING:
    from peft import LoraConfig

__all__ = ["LoraSpec"]


@dataclass(frozen=True)
class LoraSpec:
    """A peft LoRA adapter, the one shape from ``algo.lora`` to the trainer and every backend; ``target_modules``:
    module-name suffixes or ``"all-linear"`` (peft semantics). A backend publishing into an adapter needs the
    trainer's rank, alpha and targets (the keys must match)."""

    __pydantic_config__ = {"extra": "forbid"}  # as a config section (flows.config): a mistyped key is refused

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] | str = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValidationError(f"lora.rank: must be >= 1, got {self.rank}")
        if not self.target_modules:
            raise ValidationError("lora.target_modules: name at least one module, e.g. ['q_proj', 'v_proj']")
        if not isinstance(self.target_modules, str):
            object.__setattr__(self, "target_modules", tuple(self.target_modules))

    def peft(self) -> LoraConfig:
        """This adapter as peft's ``LoraConfig`` (imports peft)."""
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout, target_modules=targets,
                          bias="none", task_type="CAUSAL_LM")
