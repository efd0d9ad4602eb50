"""The run page in a real headless Chromium (Debian's ``chromium``), driven over the DevTools
protocol: it streams the turn, shows the pending permission request, a click on Approve
answers it, and the page sees the turn finish and loads the turn's diff (opened with an
approve page link: the steer box is there; with a read link it is not); a message sent from
its steer box reaches the running turn, which answers it, and shows as the turn's
user-message. The page's other renderings are in test_api_pages_render.py.

``HARNESS_PAGE_SCREENS=DIR`` saves the screenshots there (PNG), else under the test's
tmp_path."""

from __future__ import annotations

import asyncio
import base64
import json
import os
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

    async def open(self, url: str) -> None:
        """A laptop's window (1280x860) showing ``url``."""
        await self.call("Page.enable")
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            width=1280,
            height=860,
            deviceScaleFactor=1,
            mobile=False,
        )
        await self.call("Page.navigate", url=url)

    async def screenshot(self, path: Path) -> None:
        """The whole page (beyond the window) as a PNG at ``path``."""
        metrics = await self.call("Page.getLayoutMetrics")
        size = metrics["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 6000)}
        shot = await self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={**clip, "scale": 1},
        )
        png = base64.b64decode(shot["data"])
        assert png.startswith(b"\x89PNG")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)

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


def screens(tmp_path: Path) -> Path:
    """Where a test's screenshots go: HARNESS_PAGE_SCREENS, else its tmp_path."""
    return Path(os.environ.get("HARNESS_PAGE_SCREENS") or tmp_path)


EVENTS = "document.querySelector('#events').innerText"


def test_the_run_page_streams_the_turn_and_approves_a_request(
    api: ApiProcess,  # noqa: F811
    chromium: str,
) -> None:
    import websockets

    script = (
        "@text looking around\n@activity command ls -la\n@usage 120 40 0.0123\n"
        "@ask touch page.txt\n@complete page done"
    )
    with api.client("acme") as http:
        run_id = start(http, script, posture="ask", labels={"team": "blue"})
        made = http.post(f"/v1/runs/{run_id}/links", json={"mode": "approve"})
        assert made.status_code == 201, made.text
    url = made.json()["url"]

    async def scenario() -> str:
        async with websockets.connect(chromium, max_size=2**26) as socket:
            page = Page(socket)
            await page.open(url)
            await page.until(f"{EVENTS}.includes('looking around')")
            await page.until("document.querySelector('button.allow') !== null")
            await page.until("document.querySelector('#facts').innerText.includes('stdio-json')")
            assert "link=" not in await page.evaluate("location.href")  # the token left the URL
            # Mid-turn: the turn's events as what they mean, the request waiting.
            mid: str = await page.evaluate(EVENTS)
            assert "Turn 1" in mid and "stdio-json · attempt 1" in mid
            assert "ls -la" in mid and "120 in / 40 out" in mid and "$0.0123" in mid
            assert "asks" in mid and "touch page.txt" in mid
            assert "team=blue" in await page.evaluate("document.body.innerText")
            # An approve link: the steer box is there, with its three modes.
            assert await page.evaluate("document.querySelector('#steer').hidden") is False
            modes = "[...document.querySelectorAll('#steer-mode option')].map(o => o.value)"
            assert await page.evaluate(modes) == ["queue", "steer", "interrupt"]
            await page.evaluate("document.querySelector('button.allow').click()")
            await page.until(f"{EVENTS}.includes('turn complete: page done')")
            await page.until("document.querySelector('#requests').innerText.includes('nothing')")
            await page.until(f"{EVENTS}.includes('allowed (once) by api:acme:link:')")
            await page.until("document.querySelector('#turn-1 button.load-diff') !== null")
            await page.evaluate("document.querySelector('#turn-1 button.load-diff').click()")
            await page.until(
                "document.querySelector('#turn-1 pre.diff').innerText.includes('page.txt')"
            )
            text: str = await page.evaluate(EVENTS)
            return text

    text = asyncio.run(scenario())
    assert "+ page.txt" in text  # the workspace's files, as changes
    assert "undefined" not in text
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
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "connect-src 'self'" in csp and "unsafe" not in csp
    assert "<script>" not in page.text and "onclick" not in page.text


def test_a_read_link_shows_no_answers_and_no_steer_box(
    api: ApiProcess,  # noqa: F811
    chromium: str,
) -> None:
    import websockets

    with api.client("acme") as http:
        run_id = start(http, "@ask touch read.txt\n@complete read done", posture="ask")
        url = http.post(f"/v1/runs/{run_id}/links", json={"mode": "read"}).json()["url"]

        async def scenario() -> None:
            async with websockets.connect(chromium, max_size=2**26) as socket:
                page = Page(socket)
                await page.open(url)
                await page.until("document.querySelector('#requests .request') !== null")
                assert await page.evaluate("document.querySelector('#steer').hidden") is True
                assert await page.evaluate("document.querySelector('button.allow')") is None

        asyncio.run(scenario())
        http.delete(f"/v1/runs/{run_id}")


STEERED = (
    "@text reading the orders module\n@activity command grep -rn order src/\n"
    "@usage 300 40 0.0061\n@wait-message 60\n@text taking that into account\n"
    "@wait-message 60\n@complete steered twice"
)
HOSTILE_MESSAGE = '<img src=x onerror="window.pwned=1"> <script>window.pwned=2</script>'


def test_a_message_from_the_steer_box_reaches_the_running_turn(
    api: ApiProcess,  # noqa: F811
    chromium: str,
    tmp_path: Path,
) -> None:
    """The demo turn waits on its open stdin (``--posture ask``: the stdio-json channel) for
    a message twice: the page's box sends the first (mode steer) mid-turn, the turn says what
    it heard and the page shows the user-message while the turn still runs; the second, hostile
    text, ends it and is shown as text."""
    import websockets

    with api.client("acme") as http:
        run_id = start(http, STEERED, posture="ask")
        url = http.post(f"/v1/runs/{run_id}/links", json={"mode": "approve"}).json()["url"]
    result = "document.querySelector('#steer-result').innerText"

    async def send(page: Page, text: str) -> str:
        await page.evaluate(
            f"document.querySelector('#steer-text').value = {json.dumps(text)};"
            "document.querySelector('#steer-mode').value = 'steer';"
            "document.querySelector('#steer-result').textContent = '';"
            "document.querySelector('#steer-form').requestSubmit()"
        )
        await page.until(f"{result}.startsWith('accepted') || {result}.startsWith('refused')")
        said: str = await page.evaluate(result)
        return said

    async def scenario() -> dict[str, Any]:
        async with websockets.connect(chromium, max_size=2**26) as socket:
            page = Page(socket)
            await page.open(url)
            await page.until(f"{EVENTS}.includes('reading the orders module')")
            await page.until("document.querySelector('#status').innerText.startsWith('running')")
            seen: dict[str, Any] = {"first": await send(page, "use the v2 client, not v1")}
            await page.until(f"{EVENTS}.includes('message: use the v2 client, not v1')")
            await page.until(f"{EVENTS}.includes('taking that into account')")
            seen["mid"] = await page.evaluate(EVENTS)
            seen["badge"] = await page.evaluate(
                "document.querySelector('#turn-1 .badge').innerText"
            )
            seen["field"] = await page.evaluate("document.querySelector('#steer-text').value")
            await page.screenshot(screens(tmp_path) / "run-mid-turn.png")
            seen["second"] = await send(page, HOSTILE_MESSAGE)
            await page.until(f"{EVENTS}.includes('turn complete: steered twice')")
            seen["end"] = await page.evaluate(EVENTS)
            seen["messages"] = await page.evaluate(
                "[...document.querySelectorAll('#turn-1 .ev-user-message .quote')]"
                ".map(q => q.textContent)"
            )
            seen["images"] = await page.evaluate("document.querySelectorAll('img').length")
            seen["pwned"] = await page.evaluate("typeof window.pwned")
            return seen

    seen = asyncio.run(scenario())
    # The box said what the API answered: the running turn takes it.
    assert "accepted (202): sent to turn 1" in seen["first"] and seen["field"] == ""
    mid = seen["mid"]
    assert "said (steer, delivered native):" in mid and "use the v2 client, not v1" in mid
    assert seen["badge"] == "running" and "turn complete" not in mid
    assert mid.index("said (steer") < mid.index("taking that into account")
    assert "accepted (202): sent to turn 1" in seen["second"]
    assert seen["messages"] == ["use the v2 client, not v1", HOSTILE_MESSAGE]
    assert f"message: {HOSTILE_MESSAGE}" in seen["end"]
    assert seen["images"] == 0 and seen["pwned"] == "undefined"
    with api.client("acme") as http:
        events = http.get(f"/v1/runs/{run_id}/events").json()
        sent = [e["data"] for e in events if e["type"] == "user-message"]
        assert [m["text"] for m in sent] == ["use the v2 client, not v1", HOSTILE_MESSAGE]
        assert {m["mode"] for m in sent} == {"steer"} and sent[0]["by"].startswith("api:acme")
        http.delete(f"/v1/runs/{run_id}")
