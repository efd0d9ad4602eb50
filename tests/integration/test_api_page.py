"""The run page in a real headless Chromium (Debian's ``chromium``), driven over the DevTools
protocol: it streams the turn, shows the pending permission request, a click on Approve
answers it, and the page sees the turn finish (opened with an approve page link)."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import require
from tests.integration.api_server import ApiProcess, api, api_env, api_worker  # noqa: F401
from tests.integration.test_api import start

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]

HEADLESS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[str]:
    """A headless Chromium with a fresh profile; yields its DevTools page socket URL."""
    binary = shutil.which("chromium")
    require(binary is not None, "chromium is not installed (scripts/setup --test)")
    assert binary is not None
    profile = tmp_path / "profile"
    proc = subprocess.Popen(
        [
            binary,
            *HEADLESS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            assert proc.poll() is None, "chromium exited at start"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        yield page["webSocketDebuggerUrl"]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Page:
    """Just enough of the DevTools protocol: navigate, evaluate, screenshot."""

    def __init__(self, socket: Any) -> None:
        self.socket = socket
        self.n = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        await self.socket.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            message = json.loads(await self.socket.recv())
            if message.get("id") == self.n:
                assert "error" not in message, message
                result: dict[str, Any] = message["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        reply = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return reply["result"].get("value")

    async def until(self, expression: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.1)
        body = await self.evaluate("document.body.innerText")
        raise AssertionError(f"the page never showed {expression!r}; it shows:\n{body}")


def test_the_run_page_streams_the_turn_and_approves_a_request(
    api: ApiProcess,  # noqa: F811
    chromium: str,
    tmp_path: Path,
) -> None:
    import websockets

    with api.client("acme") as http:
        run_id = start(
            http, "@text looking around\n@ask touch page.txt\n@complete page done", posture="ask"
        )
        made = http.post(f"/v1/runs/{run_id}/links", json={"mode": "approve"})
        assert made.status_code == 201, made.text
    url = made.json()["url"]

    async def scenario() -> bytes:
        async with websockets.connect(chromium, max_size=2**26) as socket:
            page = Page(socket)
            await page.call("Page.enable")
            await page.call("Page.navigate", url=url)
            await page.until("document.querySelector('#events').innerText.includes('looking')")
            await page.until("document.querySelector('button.allow') !== null")
            shot = await page.call("Page.captureScreenshot", format="png")  # mid-turn
            assert "link=" not in await page.evaluate("location.href")  # the token left the URL
            await page.evaluate("document.querySelector('button.allow').click()")
            await page.until(
                "document.querySelector('#events').innerText.includes('turn complete: page done')"
            )
            await page.until("document.querySelector('#requests').innerText.includes('nothing')")
            await page.evaluate("document.querySelector('#load-diff').click()")
            await page.until("document.querySelector('#diff').innerText.includes('page.txt')")
            return base64.b64decode(shot["data"])

    png = asyncio.run(scenario())
    assert png.startswith(b"\x89PNG")
    (tmp_path / "run-page.png").write_bytes(png)
    with api.client("acme") as http:
        decision = next(
            e
            for e in http.get(f"/v1/runs/{run_id}/events").json()
            if e["type"] == "permission-decision"
        )
        # Answered through the page's link: the decision names it.
        assert decision["data"]["by"] == f"api:acme:link:{made.json()['link_id']}"
    page = httpx.get(f"{api.url}/runs/{run_id}")
    assert page.status_code == 200 and api.keys["acme"] not in page.text
    assert "connect-src 'self'" in page.headers["content-security-policy"]
