"""A real browser for the console's tests: Debian's chromium, headless, driven through Debian's
chromedriver by Selenium (nothing here downloads a browser). Selenium blocks, so every call runs
on a worker thread (`anyio.to_thread`), and the daemon and the console, in the test's own event
loop, go on serving meanwhile."""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final, TypeVar

import anyio.to_thread
from selenium import webdriver
from selenium.common.exceptions import (
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

__all__ = ["CHROMEDRIVER", "CHROMIUM", "Browser", "browser", "missing_reason"]

CHROMIUM: Final = "/usr/bin/chromium"
CHROMEDRIVER: Final = "/usr/bin/chromedriver"
T = TypeVar("T")

#: as root, chromium needs --no-sandbox; the rest keeps it off a closed network (no updates,
#: no sync, no background fetches) and off /dev/shm, which is small in containers
_FLAGS: Final = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--window-size=1400,1000",
)


def _replaced(exc: WebDriverException) -> bool:
    """chromedriver's other word for a stale element (the page replaced it meanwhile)."""
    return "does not belong to the document" in str(exc.msg)


def missing_reason() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is missing (Debian: apt-get install chromium chromium-driver)"
    return None


class Browser:
    """One headless chromium window; each method is one blocking step on a worker thread."""

    def __init__(self, driver: webdriver.Chrome, base: str) -> None:
        self.driver = driver
        self.base = base

    async def _run(self, call: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(call)

    async def open(self, path: str) -> None:
        await self._run(functools.partial(self.driver.get, self.base + path))

    async def find(self, css: str) -> WebElement:
        return await self._run(functools.partial(self.driver.find_element, By.CSS_SELECTOR, css))

    async def all(self, css: str) -> list[WebElement]:
        return await self._run(functools.partial(self.driver.find_elements, By.CSS_SELECTOR, css))

    async def type(self, css: str, text: str) -> None:
        def type_in() -> None:
            for _ in range(50):
                try:
                    element = self.driver.find_element(By.CSS_SELECTOR, css)
                    element.clear()
                    element.send_keys(text)
                    return
                except StaleElementReferenceException:
                    continue  # replaced by a live refresh before it held text: again
                except WebDriverException as exc:
                    if not _replaced(exc):
                        raise
            raise AssertionError(f"{css} kept being replaced while typed in")

        await self._run(type_in)

    async def click(self, css: str) -> None:
        def click() -> None:
            for _ in range(50):
                try:
                    self.driver.find_element(By.CSS_SELECTOR, css).click()
                    return
                except StaleElementReferenceException:
                    continue
                except WebDriverException as exc:
                    if not _replaced(exc):
                        raise
            raise AssertionError(f"{css} kept being replaced while clicked")

        await self._run(click)

    async def text(self, css: str = "body") -> str:
        """The element's text; read again if the live page replaced it meanwhile."""

        def read() -> str:
            for _ in range(50):
                try:
                    return str(self.driver.find_element(By.CSS_SELECTOR, css).text)
                except StaleElementReferenceException:
                    continue
                except WebDriverException as exc:
                    if not _replaced(exc):
                        raise
            raise AssertionError(f"{css} kept being replaced while read")

        return await self._run(read)

    async def script(self, code: str, *args: object) -> object:
        return await self._run(functools.partial(self.driver.execute_script, code, *args))

    async def url(self) -> str:
        return str(await self._run(lambda: self.driver.current_url))

    async def title(self) -> str:
        return str(await self._run(lambda: self.driver.title))

    async def wait_text(self, css: str, wanted: str, timeout_s: float = 20.0) -> str:
        """Wait until the element *css* shows *wanted* (the page updates itself)."""

        def shown(driver: webdriver.Chrome) -> str | bool:
            found = driver.find_elements(By.CSS_SELECTOR, css)
            text = found[0].text if found else ""
            return text if wanted in text else False

        def wait() -> str:
            try:
                # the live page replaces its content: an element found may be gone when read
                waiting = WebDriverWait(
                    self.driver,
                    timeout_s,
                    0.05,
                    # chromedriver's "Node with given id does not belong to the document":
                    # the same race, seen while a page is replaced by the next one
                    ignored_exceptions=(StaleElementReferenceException, WebDriverException),
                )
                return str(waiting.until(shown))
            except TimeoutException:
                found = self.driver.find_elements(By.CSS_SELECTOR, css)
                now = found[0].text if found else "(no such element)"
                msg = f"{css} did not show {wanted!r} in {timeout_s} s; it shows {now!r}"
                raise AssertionError(msg) from None

        return await self._run(wait)

    async def console_errors(self) -> list[str]:
        """What the page logged as errors since the last call (a script error, a resource or
        an inline script the Content-Security-Policy refused, a failed request)."""
        entries = await self._run(lambda: self.driver.get_log("browser"))  # type: ignore[no-untyped-call]
        return [str(e["message"]) for e in entries if e.get("level") == "SEVERE"]

    async def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        await self._run(functools.partial(self.driver.save_screenshot, str(path)))


@asynccontextmanager
async def browser(base: str) -> AsyncIterator[Browser]:
    """A fresh headless chromium (its own empty profile) for the console at *base*."""
    profile = tempfile.mkdtemp(prefix="hh-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER)
    driver = await anyio.to_thread.run_sync(
        functools.partial(webdriver.Chrome, service=service, options=options)
    )
    try:
        yield Browser(driver, base)
    finally:
        await anyio.to_thread.run_sync(driver.quit)
        shutil.rmtree(profile, ignore_errors=True)
