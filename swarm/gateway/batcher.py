"""Group commit: concurrent calls' pool work done in one pool call per batch.

A :class:`Batcher` collects items submitted by concurrent requests while the previous batch is
running, then hands all of them to one ``run`` (one pool transaction) and wakes each caller
with its own result. Nothing waits on a timer: at one client a batch is that client's item, so
there is no added latency; under load a batch is whatever arrived during the last transaction.

With a ``gate`` (the SQLite pool's one-writer lock, shared by the step, open and end writers) a batch is
taken only once the gate is held: items that arrive while another writer's transaction runs join the
next batch instead of each queueing for the gate in a batch of its own. Measured on the default flow
(``benchmarks/update_bench.py``, the gate timed): ~1.1 items per transaction and the gate busy ~80% of the
time before, 2.1-3.3 items per transaction after.

Each caller's ``submit`` returns only after the batch holding its item returned, i.e. after
the pool committed it (the durability of one call is exactly that of one transaction). When a
batch of several items fails, each item is retried alone, so one bad call (an ended episode, a
conflicting step id) fails only itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["Batcher"]

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """Runs ``run(items) -> results`` (same order, same length) over batches of concurrently submitted items."""

    def __init__(self, run: Callable[[list[T]], Awaitable[list[R]]], max_items: int = 256,
                 gate: asyncio.Lock | None = None) -> None:
        self._run = run
        self.max_items = max_items
        self._gate = gate  # held around each batch (``run`` must not take it itself)
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None
        self.batches = 0  # how many batches ran (for tests and benchmarks)
        self.items = 0

    async def submit(self, item: T) -> R:
        """``item``'s result, once the batch holding it has run."""
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        while self._pending:
            async with self._gate or contextlib.nullcontext():
                await self._one_batch()

    async def _one_batch(self) -> None:
        batch, self._pending = self._pending[: self.max_items], self._pending[self.max_items:]
        self.batches += 1
        self.items += len(batch)
        try:
            results = await self._run([item for item, _ in batch])
        except Exception as exc:  # noqa: BLE001 - handed to the callers, or isolated below
            if len(batch) == 1:
                _settle(batch[0][1], exc=exc)
                return
            await self._one_by_one(batch)
            return
        for (_, fut), res in zip(batch, results, strict=True):
            _settle(fut, res)

    async def _one_by_one(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        for item, fut in batch:
            try:
                (res,) = await self._run([item])
            except Exception as exc:  # noqa: BLE001 - this caller's own error
                _settle(fut, exc=exc)
            else:
                _settle(fut, res)


def _settle(fut: asyncio.Future, res: object = None, exc: BaseException | None = None) -> None:
    if fut.done():  # the caller went away (request cancelled); its item was still processed
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(res)
