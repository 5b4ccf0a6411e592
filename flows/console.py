"""Rich console output for the flows: live progress while collecting and training, and the
final summary table. Presentation only."""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from swarm.pool import Lookup

__all__ = ["TrainProgress", "say", "warn", "where", "summary_values", "summary"]

console = Console()
log = logging.getLogger("swarm.run")


def say(text: str) -> None:
    """One line for the person at the terminal (rich markup allowed)."""
    console.print(text, highlight=False)


def warn(text: str) -> None:
    """A warning line for the person at the terminal (plain text: no markup read in it), also logged."""
    console.print(f"[yellow]warning[/yellow]: {escape(text)}", highlight=False)
    log.warning("%s", text)


def where(*, gateway: str, run_dir: Path, mlflow_uri: str, experiment: str, run_name: str, run_id: str,
          model: str | None = None) -> None:
    """Where things are, printed once at start: the model's weights (and their sha256, to compare machines),
    the gateway and its dashboard, the run folder, MLflow."""
    if model is not None:
        say(f"model      {model}{_weights_digest(Path(model))}")
    say(f"gateway    {gateway}/v1")
    say(f"dashboard  {gateway}/dashboard")
    say(f"run folder {run_dir}")
    say(f"mlflow     {mlflow_uri} (experiment {experiment!r})")
    say(f"mlflow run {run_name!r} ({run_id})")


def _weights_digest(folder: Path) -> str:
    """`` (model.safetensors sha256 abcd...)`` for a local checkpoint folder, else empty (a hub id)."""
    from swarm.policy.shipped import sha256_file

    weights = folder / "model.safetensors"
    return f" (model.safetensors sha256 {sha256_file(weights)[:16]})" if weights.is_file() else ""


class TrainProgress:
    """``update n/N`` with the latest reward, plus what the batching strategy is waiting for."""

    def __init__(self, updates: int, pool: Lookup) -> None:
        self.pool = pool
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
                                 transient=False)
        self.task = self.progress.add_task("updates", total=updates, info="starting")
        self.last = ""
        self._t0 = time.monotonic()
        self._seen: tuple[float, int] | None = None  # (time, steps in the pool) at the previous count
        self._rate = ""

    def __enter__(self) -> TrainProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def set_total(self, updates: int) -> None:
        """A new number of updates for the bar (a client retuned ``updates`` mid-run: flows.control)."""
        self.progress.update(self.task, total=max(updates, 0))

    def on_poll(self, decision: Any) -> None:
        """While a batch collects: what the strategy waits for, episodes done, recorded calls per second."""
        self.progress.update(self.task, info=f"{self.last}  collecting: {decision.reason}{self._activity()}")

    def _activity(self) -> str:
        now = time.monotonic()
        if self._seen is not None and now - self._seen[0] < 2.0:
            return self._rate  # counting is a query: at most every 2 s
        try:
            from swarm.pool import StepFilter
            from swarm.records import EpisodeStatus

            steps = self.pool.count_steps()
            episodes = self.pool.count_episodes(StepFilter(episode_status=EpisodeStatus.finished))
        except Exception:  # noqa: BLE001 - a progress line must never stop training
            return self._rate
        t_prev, n_prev = self._seen or (self._t0, steps)
        rate = (steps - n_prev) / max(now - t_prev, 1e-9) if self._seen else 0.0
        self._seen = (now, steps)
        self._rate = f" ({episodes} episodes done, {rate:.1f} calls/s)"
        return self._rate

    def advance(self, row: dict[str, float]) -> None:
        reward = row.get("reward/mean", row.get(next((k for k in row if k.startswith("reward/mean")), ""), 0.0))
        self.last = f"reward {reward:.3f}  loss {row.get('train/loss', float('nan')):.4f}"
        self.progress.update(self.task, advance=1, info=self.last)


def summary_values(history: list[dict[str, float]], wall_s: float) -> dict[str, float]:
    """Mean reward of the first 5 and last 10 updates (single updates are noisy: a few prompt groups
    each), the best update, the update count and the wall time in minutes."""
    keys = sorted({k for row in history for k in row if k.startswith("reward/mean")})
    key = keys[0] if keys else "reward/mean"
    rewards = [row.get(key, 0.0) for row in history]
    out: dict[str, float] = {"updates": float(len(history)), "wall_min": wall_s / 60}
    if rewards:
        out.update(reward_first5=statistics.fmean(rewards[:5]), reward_last10=statistics.fmean(rewards[-10:]),
                   reward_best=max(rewards))
    return out


class RunSummary(TypedDict):
    """What a run returns: its MLflow run id, how it ended and :func:`summary_values`' numbers."""

    run_id: str
    status: str
    updates: int
    reward_first5: float | None
    reward_last10: float | None
    reward_best: float | None
    wall_min: float | None


def summary(history: list[dict[str, float]], run_id: str, status: str,
            values: dict[str, float] | None = None) -> RunSummary:
    """Print the summary table; return the run id, status, update count and :func:`summary_values`."""
    vals = values if values is not None else summary_values(history, 0.0)
    out = RunSummary(run_id=run_id, status=status, updates=len(history), reward_first5=vals.get("reward_first5"),
                     reward_last10=vals.get("reward_last10"), reward_best=vals.get("reward_best"),
                     wall_min=vals.get("wall_min"))
    table = Table(title=f"swarmpool run {run_id} ({status})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in out.items():
        table.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
    if history:
        for k in ("merge/token_ratio", "train/loss", "pool/staleness", "throughput/steps_per_s", "episodes/win",
                  "eval/win", "eval/reward", "mismatch/logprob_abs_mean"):
            if k in history[-1]:
                table.add_row(f"last {k}", f"{history[-1][k]:.3f}")
    console.print(table)
    return out
