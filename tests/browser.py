"""A headless Chromium driven over the Chrome DevTools Protocol (CDP), for the browser tests of the web client.

No driver binary and no browser download: Debian's ``chromium`` is started with ``--remote-debugging-port=0``, and
its DevTools WebSocket (announced in ``DevToolsActivePort`` in the profile directory) is spoken with the
``websockets`` package the server already depends on. Only what the tests need: open a page, evaluate
JavaScript, click like a user, set a file input, capture a screenshot, allow downloads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect

__all__ = ["BROWSER_FLAGS", "Chromium", "Page", "chromium_path", "launch"]

BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",  # CI runs as root, where the sandbox cannot start
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--use-fake-ui-for-media-stream",  # grant the microphone without a prompt
    "--use-fake-device-for-media-stream",
    "--window-size=1000,900",
)


def chromium_path() -> str | None:
    """Debian's chromium, or another Chromium or Chrome on the PATH."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path is not None:
            return path
    return None


class CdpError(RuntimeError):
    """A DevTools command failed, or JavaScript threw."""


class Chromium:
    """One browser process and its DevTools connection. Build with :func:`launch`."""

    def __init__(self, process: asyncio.subprocess.Process, ws: ClientConnection) -> None:
        self.process = process
        self.ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self._event_arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.ws:
            message = json.loads(raw)
            if "id" in message:
                future = self._pending.pop(message["id"], None)
                if future is not None and not future.done():
                    future.set_result(message)
            else:
                self.events.append(message)
                self._event_arrived.set()

    async def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        """Run one CDP command and return its result; raise :class:`CdpError` if it failed."""
        command_id = next(self._ids)
        command: dict[str, Any] = {"id": command_id, "method": method, "params": params or {}}
        if session is not None:
            command["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = future
        await self.ws.send(json.dumps(command))
        answer = await asyncio.wait_for(future, 30)
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    async def new_page(self, url: str) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        for domain in ("Page", "Runtime", "DOM"):
            await page.send(f"{domain}.enable")
        await page.goto(url)
        return page

    async def allow_downloads(self, directory: Path) -> None:
        await self.send(
            "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(directory), "eventsEnabled": True}
        )

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.send("Browser.close"), 5)
        await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


class Page:
    """One tab, attached in flat mode (commands carry its session id)."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return await self.browser.send(method, params, self.session)

    @property
    def exceptions(self) -> list[str]:
        """Uncaught JavaScript exceptions of this page so far."""
        return [
            json.dumps(e["params"]["exceptionDetails"])
            for e in self.browser.events
            if e.get("sessionId") == self.session and e["method"] == "Runtime.exceptionThrown"
        ]

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})
        await self.wait_for("document.readyState === 'complete'")

    async def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` (awaited if a promise), as JSON."""
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0, interval: float = 0.1) -> Any:
        """Poll until ``expression`` is truthy; return its value. Raise TimeoutError naming it otherwise."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if loop.time() > deadline:
                status = await self.evaluate("document.querySelector('#status')?.textContent")
                raise TimeoutError(f"waited {timeout} s for {expression!r}; #status says {status!r}")
            await asyncio.sleep(interval)

    async def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element, scrolled into view first (a user gesture, as audio
        needs)."""
        box = await self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}
            )

    async def set_files(self, selector: str, paths: list[Path]) -> None:
        """Choose ``paths`` in a file input, as the file dialog would (fires ``input`` and ``change``)."""
        document = await self.send("DOM.getDocument")
        node = await self.send("DOM.querySelector", {"nodeId": document["root"]["nodeId"], "selector": selector})
        await self.send("DOM.setFileInputFiles", {"nodeId": node["nodeId"], "files": [str(p) for p in paths]})

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))


@contextlib.asynccontextmanager
async def launch(profile: Path, *extra_flags: str) -> AsyncIterator[Chromium]:
    """Start a fresh headless Chromium with its profile in ``profile``; close it on leaving."""
    executable = chromium_path()
    if executable is None:
        raise FileNotFoundError("chromium is not installed (apt-get install chromium chromium-driver)")
    profile.mkdir(parents=True, exist_ok=True)
    log = (profile / "chromium.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        executable,
        *BROWSER_FLAGS,
        *extra_flags,
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        "about:blank",
        stdout=log,
        stderr=log,
        env={**os.environ, "LANG": "en_US.UTF-8"},
    )
    try:
        port_file = profile / "DevToolsActivePort"
        for _ in range(300):
            if port_file.exists() and len(port_file.read_text().splitlines()) >= 2:
                break
            if process.returncode is not None:
                raise RuntimeError(f"chromium exited with {process.returncode}; see {profile / 'chromium.log'}")
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError(f"chromium did not open its DevTools port; see {profile / 'chromium.log'}")
        port, path = port_file.read_text().splitlines()[:2]
        ws = await ws_connect(f"ws://127.0.0.1:{port}{path}", max_size=None)
    except BaseException:
        process.kill()
        await process.wait()
        log.close()
        raise
    browser = Chromium(process, ws)
    try:
        yield browser
    finally:
        await browser.close()
        log.close()
