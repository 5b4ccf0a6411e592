"""A verifiers environment held in ``env.serving()`` for the life of the process, on its own event loop.

``serving()`` starts the environment's interception pool and its taskset-scoped tool servers (each a
``python -m <toolset module>`` process on 127.0.0.1, ~3 s to start here): once per process, not once per
episode. Worker threads submit episodes with :meth:`ServedEnv.run_episode`; they run concurrently on the
loop, as in verifiers' own eval runner. Each episode names its own OpenAI endpoint (the swarm episode's
key), and verifiers' interception keeps one upstream client per distinct endpoint until ``serving()``
ends, so :meth:`ServedEnv.run_episode` closes the episode's client afterwards (else a long run keeps one
open connection per episode). At exit, ``serving()`` is left (tool servers stopped, their scratch folders
removed) from a ``threading`` exit hook: verifiers' teardown uses the loop's thread pool, which refuses work
once ``concurrent.futures``' own exit hook has run, and ``atexit`` callbacks run after that.
Nothing here knows the swarm SDK.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from typing import Any

__all__ = ["ServedEnv"]

CLOSE_TIMEOUT_S = 30.0


class ServedEnv:
    """``env`` inside ``serving()`` on a daemon thread's event loop; ``close()`` leaves it (idempotent)."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="verifiers-serving", daemon=True)
        self._thread.start()
        self._stack = contextlib.AsyncExitStack()
        try:
            self._submit(self._stack.enter_async_context(env.serving())).result()
        except BaseException:
            self._stop_loop()
            raise
        # threading's exit hooks run in reverse order of registration, so this one runs before the thread pools stop
        getattr(threading, "_register_atexit", atexit.register)(self.close)

    def _submit(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run_episode(self, task: Any, ctx: Any) -> Any:
        """``env.run_episode(task, ctx)`` on the serving loop (blocks the calling thread); returns the Episode."""
        return self._submit(self._episode(task, ctx)).result()

    async def _episode(self, task: Any, ctx: Any) -> Any:
        try:
            return await self.env.run_episode(task, ctx)
        finally:
            await self._drop_client(ctx.client)

    async def _drop_client(self, config: Any) -> None:
        # verifiers 0.4.0 caches the upstream client per endpoint config on each interception server
        # (InterceptionServer.clients, closed with the server): ours are per episode, so close them now
        key = config.model_dump_json()
        interception = getattr(self.env, "_interception", None)
        for server in getattr(interception, "servers", None) or [interception]:
            client = getattr(server, "clients", {}).pop(key, None)
            if client is not None:
                await client.close()

    def close(self) -> None:
        """Leave ``serving()`` (tool servers and interception down) and stop the loop."""
        if not self._loop.is_running():
            return
        try:
            self._submit(self._stack.aclose()).result(CLOSE_TIMEOUT_S)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_TIMEOUT_S)
