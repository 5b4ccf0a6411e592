"""Dashboard fixtures: a real gateway with real traffic, and a headless Chromium driven by playwright."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from populate import ADMIN, finished_game_run, populate

from swarm.gateway import GatewaySettings
from swarm.policy.echo import EchoBackend
from swarm.pool import Pool
from swarm.stack import start_stack

# Debian's chromium, loopback only (see shared/ENVIRONMENT.md "Browser tests")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost , EXCLUDE 127.0.0.1",
]


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A headless Chromium (skips when chromium or playwright is not installed).

    Module-scoped: playwright's sync API keeps an asyncio loop running in the main thread while
    it is open, which would break later tests that call ``asyncio.run``.
    """
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium); .ci/run installs it")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; the dev extra has it)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Page:
    """A browser page that records console errors and uncaught exceptions."""

    def __init__(self, browser: Any, base: str) -> None:
        self.ctx = browser.new_context(viewport={"width": 1360, "height": 900}, accept_downloads=True)
        # the gateway has an admin token, so reads need it too: the page keeps it in localStorage
        self.ctx.add_init_script(f"localStorage.setItem('swarm-admin-token', {ADMIN!r})")
        self.page = self.ctx.new_page()
        self.base = base
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}")
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("requestfailed", lambda r: self.errors.append(f"requestfailed: {r.url}"))

    def view(self, name: str) -> Any:
        """Open a view and wait until its data has rendered once."""
        p = self.page
        if p.url.startswith(self.base + "/dashboard"):
            p.evaluate(f"location.hash = '#{name}'")
        else:
            p.goto(f"{self.base}/dashboard#{name}")
        p.wait_for_selector(f"body[data-loaded='{name}']", timeout=20_000)
        return p

    def shot(self, name: str, selector: str | None = None) -> None:
        """Screenshot (of the page, or of the element ``selector``) into $SWARM_SCREENSHOTS_DIR when set."""
        out = os.environ.get("SWARM_SCREENSHOTS_DIR")
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            path = str(Path(out) / f"dashboard-{name}.png")
            self.page.evaluate("window.scrollTo(0, 0)")
            if selector:
                self.page.locator(selector).screenshot(path=path)
            else:
                self.page.screenshot(path=path, full_page=True)

    def close(self) -> None:
        self.ctx.close()


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A gateway (admin token set) over a fresh pool, after real traffic and two training rounds."""
    d = tmp_path_factory.mktemp("dash")
    pool = Pool(f"sqlite:///{d / 'pool.db'}")
    backend = EchoBackend()
    stack = start_stack(pool, backend, GatewaySettings(admin_token=ADMIN))
    try:
        ids = populate(stack.url, pool, backend, headers={"Authorization": f"Bearer {ADMIN}"})
        yield {"url": stack.url, "pool": pool, "backend": backend, "ids": ids, "stack": stack}
    finally:
        stack.stop()
        pool.close()


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A gateway over a pool holding only a werewolves-like run that ended three hours ago."""
    d = tmp_path_factory.mktemp("finished")
    pool = Pool(f"sqlite:///{d / 'pool.db'}")
    run = finished_game_run(pool)
    stack = start_stack(pool, EchoBackend(), GatewaySettings(admin_token=ADMIN))
    try:
        yield {"url": stack.url, "pool": pool, **run}
    finally:
        stack.stop()
        pool.close()


@pytest.fixture
def open_page(chromium: Any) -> Iterator[Callable[[str], Page]]:
    pages: list[Page] = []

    def make(base: str) -> Page:
        p = Page(chromium, base)
        pages.append(p)
        return p

    yield make
    for p in pages:
        p.close()
