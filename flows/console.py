"""Rich console output for the flows: live progress while collecting and training, and the
final summary table. Presentation only."""

from __future__ import annotations

import statistics
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["TrainProgress", "summary"]

console = Console()


class TrainProgress:
    """``update n/N`` with the latest reward, plus what the batching strategy is waiting for."""

    def __init__(self, updates: int, pool: Any) -> None:
        self.pool = pool
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
                                 transient=False)
        self.task = self.progress.add_task("updates", total=updates, info="starting")
        self.last = ""

    def __enter__(self) -> TrainProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def on_poll(self, decision: Any) -> None:
        self.progress.update(self.task, info=f"{self.last}  collecting: {decision.reason}")

    def advance(self, row: dict[str, float]) -> None:
        reward = row.get("reward/mean", row.get(next((k for k in row if k.startswith("reward/mean")), ""), 0.0))
        self.last = f"reward {reward:.3f}  loss {row.get('train/loss', float('nan')):.4f}"
        self.progress.update(self.task, advance=1, info=self.last)


def summary(history: list[dict[str, float]], run_id: str, status: str) -> dict[str, Any]:
    """Print the summary table; return the mean reward of the first 5 and last 10 updates, the best
    one, and the MLflow run id."""
    keys = sorted({k for row in history for k in row if k.startswith("reward/mean")})
    key = keys[0] if keys else "reward/mean"
    rewards = [row.get(key, 0.0) for row in history]
    # single updates are noisy (a few prompt groups each): report windows
    out = {"run_id": run_id, "status": status, "updates": len(history),
           "reward_first5": statistics.fmean(rewards[:5]) if rewards else None,
           "reward_last10": statistics.fmean(rewards[-10:]) if rewards else None,
           "reward_best": max(rewards) if rewards else None}
    table = Table(title=f"swarmpool run {run_id} ({status})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in out.items():
        table.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
    if history:
        for k in ("merge/token_ratio", "train/loss", "pool/staleness", "throughput/steps_per_s"):
            if k in history[-1]:
                table.add_row(f"last {k}", f"{history[-1][k]:.3f}")
    console.print(table)
    return out
