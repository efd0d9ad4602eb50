"""The pages in a real headless Chromium, against a real ``harness api`` and worker: a run's
turns each shown as what its events mean (a failed turn with its reason, a parked one,
hostile text kept as text), every event type of docs/events.md rendered, the runs list with
its filters opening a run through a page link, the steer box, a real group of three attempts
as columns on an attempt's page (its link reads the group) and on the runs list (with the
key: another attempt opened, the diff of two, a pick), and a real fork's lineage.

``HARNESS_PAGE_SCREENS=DIR`` saves the screenshots there (PNG), else under tmp_path."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.events import EVENT_TYPES
from bench.worker import IsolatedEnv as Env
from tests.integration.api_server import ApiProcess, api, api_env, api_worker  # noqa: F401
from tests.integration.test_api import RUN, start, wait_terminal
from tests.integration.test_api_page import EVENTS, Page, chromium, screens  # noqa: F401
from worker.api import links, routes

pytestmark = [pytest.mark.redis, pytest.mark.celery, pytest.mark.slow]

HOSTILE = '<img src=x onerror="window.pwned=1"> </div><script>window.pwned=2</script> & done'

# No row may be left as a bare type name, nor say a value it does not have.
BARE = f"""(() => {{
  const types = {json.dumps(list(EVENT_TYPES))};
  const rows = [...document.querySelectorAll('#events .ev')];
  const bad = rows.filter((r) => {{
    const what = r.querySelector('.what').innerText.trim();
    return !what || types.includes(what) || r.classList.contains('ev-other');
  }}).map((r) => r.innerText);
  const text = document.querySelector('#events').innerText;
  for (const t of types) if (text.includes('[' + t + ']')) bad.push('[' + t + ']');
  for (const word of ['undefined', 'NaN', '[object Object]']) if (text.includes(word)) bad.push(word);
  return bad;
}})()"""


def open_link(http: httpx.Client, run_id: str, mode: str = "read") -> str:
    made = http.post(f"/v1/runs/{run_id}/links", json={"mode": mode})
    assert made.status_code == 201, made.text
    url: str = made.json()["url"]
    return url


async def browse(chromium_url: str, scenario: Any) -> Any:
    import websockets

    async with websockets.connect(chromium_url, max_size=2**26) as socket:
        return await scenario(Page(socket))


def test_every_turn_is_shown_a_failed_one_with_its_reason_and_hostile_text_as_text(
    api: ApiProcess,  # noqa: F811
    chromium: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    with api.client("acme") as http:
        run_id = start(
            http, f"@text {HOSTILE}\n@activity file edited notes.txt\n@usage 50 10\n@complete first"
        )
        wait_terminal(http, run_id, 1)
        for turn, script in (
            (2, "@error the model said no"),
            (3, "@stderr boom on stderr\n@exit 3"),
        ):
            submitted = http.post(f"/v1/runs/{run_id}/turns", json={"input": script})
            assert submitted.status_code == 202, submitted.text
            wait_terminal(http, run_id, turn)
        url = open_link(http, run_id)

        async def failed(page: Page) -> dict[str, Any]:
            await page.open(url)
            await page.until(f"{EVENTS}.includes('exit: ')")
            await page.until("document.querySelector('#status').innerText.startsWith('idle')")
            await page.screenshot(screens(tmp_path) / "run-failed-turn.png")
            # The turn after it meets a rate limit and parks the run.
            submitted = http.post(
                f"/v1/runs/{run_id}/turns", json={"input": "@limit 1 rate-limited 120"}
            )
            assert submitted.status_code == 202, submitted.text
            await page.until(f"{EVENTS}.includes('parked (rate-limited) until')")
            await page.until(
                "document.querySelector('#turn-4 .badge').innerText.includes('parked: ')"
            )
            return {
                "text": await page.evaluate(EVENTS),
                "bare": await page.evaluate(BARE),
                "turns": await page.evaluate(
                    "[...document.querySelectorAll('section.turn')].map(s => s.dataset.turn)"
                ),
                "states": await page.evaluate(
                    "[...document.querySelectorAll('.turn-head .badge')].map(b => b.innerText)"
                ),
                "stderr": await page.evaluate(
                    "document.querySelector('#turn-3 .ev-session-error details pre').textContent"
                ),
                "images": await page.evaluate("document.querySelectorAll('img').length"),
                "pwned": await page.evaluate("typeof window.pwned"),
            }

        seen = asyncio.run(browse(chromium, failed))
        http.delete(f"/v1/runs/{run_id}")
    text = seen["text"]
    assert seen["bare"] == []
    assert seen["turns"] == ["1", "2", "3", "4"]
    assert seen["states"] == [
        "complete",
        "failed: harness-error",
        "failed: exit",
        "parked: rate-limited",
    ]
    assert "harness-error: the model said no" in text and "not retryable" in text
    assert "rate-limited: scripted limit: rate-limited" in text and "retryable after" in text
    assert "turn 5 sends the same input again" in text
    assert "boom on stderr" in seen["stderr"] and "exit 3" in text
    # Hostile text is shown as the text it is, and nothing of it runs or renders.
    assert HOSTILE in text
    assert seen["images"] == 0 and seen["pwned"] == "undefined"
    assert "edited notes.txt" in text and "50 in / 10 out" in text


def _publish(
    env: Env, run_id: str, turn: int, events: list[tuple[str, dict[str, Any]]], first: int = 0
) -> None:
    """Events as the worker publishes them (docs/events.md), for those a demo turn cannot
    make: a tool's call through the MCP endpoint, a person's message, the gateway's count,
    a refused connection."""
    r = env.redis()
    for seq, (kind, data) in enumerate(events, first):
        fields: dict[Any, Any] = {"type": kind, "data": json.dumps(data), "ts": str(time.time())}
        r.xadd(env.keys.events(run_id), fields, id=f"{turn}-{seq}")


def test_every_event_type_is_shown_as_what_it_means(
    api: ApiProcess,  # noqa: F811
    api_env: Env,  # noqa: F811
    chromium: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    with api.client("acme") as http:
        run_id = start(http, "@complete seeded")
        wait_terminal(http, run_id, 1)
        url = open_link(http, run_id)
    # Turn 2 as a worker would publish it (the run stays idle: nothing else writes turn 2).
    turn: list[tuple[str, dict[str, Any]]] = [
        ("turn-started", {"harness": "claude-code", "attempt": 2, "input_chars": 31}),
        ("session", {"session_id": "sess-7", "resumed": True, "model": "claude-x"}),
        ("assistant-text", {"text": "Looking at "}),
        ("assistant-text", {"text": "the orders."}),
        ("sandbox-activity", {"kind": "command", "description": "grep -rn order src/"}),
        (
            "sandbox-activity",
            {
                "kind": "network",
                "description": "refused by the egress gateway",
                "host": "evil.example",
                "port": 443,
                "denied": True,
            },
        ),
        ("sandbox-activity", {"kind": "model", "description": "model fallback: b served a"}),
        (
            "permission-request",
            {
                "request_id": "p2-1",
                "description": "edit src/orders.py",
                "command": None,
                "tool": "Edit",
                "input": '{"file": "o.py"}',
                "input_chars": 16,
                "deadline": time.time() + 60,
            },
        ),
        (
            "permission-decision",
            {
                "request_id": "p2-1",
                "decision": "deny",
                "scope": "once",
                "by": "api:acme:ceo",
                "message": "not that file",
            },
        ),
        (
            "user-message",
            {
                "text": "use the v2 client",
                "mode": "steer",
                "by": "api:acme:ceo",
                "delivery": "native",
                "message_id": "m1",
            },
        ),
        (
            "tool-call",
            {
                "call_id": "c1",
                "server": "orders",
                "tool": "lookup",
                "input": '{"id": 7}',
                "input_chars": 9,
            },
        ),
        (
            "tool-result",
            {
                "call_id": "c1",
                "ok": False,
                "output": "no such order",
                "output_chars": 13,
                "duration_ms": 12,
            },
        ),
        (
            "usage",
            {
                "input_tokens": 900,
                "output_tokens": 80,
                "cached_input_tokens": 300,
                "cost_usd": 0.02,
                "source": "harness",
                "model": None,
            },
        ),
        (
            "usage",
            {
                "input_tokens": 910,
                "output_tokens": 80,
                "cached_input_tokens": 0,
                "cost_usd": None,
                "source": "gateway",
                "model": "claude-x-2",
            },
        ),
        (
            "workspace",
            {
                "snapshot": "s2",
                "added": ["src/new.py"],
                "modified": ["src/o.py"],
                "deleted": [],
                "added_count": 1,
                "modified_count": 1,
                "deleted_count": 0,
                "lines_added": 12,
                "lines_removed": 3,
                "large": [],
                "complete": True,
                "note": None,
                "rewound_to": None,
                "pushed_branch": "agent/orders",
            },
        ),
        (
            "usage",
            {
                "input_tokens": 400,
                "output_tokens": 20,
                "cached_input_tokens": 0,
                "cost_usd": 0.004,
                "source": "grader",
                "model": None,
            },
        ),
        (
            "outcome-evaluation",
            {
                "iteration": 1,
                "satisfied": False,
                "feedback": "<b>the v2 tests</b> still fail",
                "grader_run_id": "r0123456789abcdef01234567",
                "input_tokens": 400,
                "output_tokens": 20,
                "cost_usd": 0.004,
            },
        ),
    ]
    terminal: tuple[str, dict[str, Any]] = (
        "turn-complete",
        {
            "text": "Fixed the lookup.",
            "session_id": "sess-7",
            "model": "claude-x",
            "input_tokens": 900,
            "output_tokens": 80,
            "cost_usd": 0.02,
            "exit_code": 0,
        },
    )
    shown = {kind for kind, _ in [*turn, terminal]} | {"session-error", "parked"}
    assert shown == set(EVENT_TYPES)  # every type is met here or in the test above

    async def scenario(page: Page) -> dict[str, Any]:
        await page.open(url)
        await page.until(f"{EVENTS}.includes('turn complete: seeded')")
        _publish(api_env, run_id, 2, turn)
        await page.until(f"{EVENTS}.includes('pushed to agent/orders')")
        running = await page.evaluate("document.querySelector('#turn-2 .badge').innerText")
        _publish(api_env, run_id, 2, [terminal], first=len(turn))
        await page.until(f"{EVENTS}.includes('Fixed the lookup.')")
        await page.screenshot(screens(tmp_path) / "run-every-event.png")
        return {
            "running": running,
            "text": await page.evaluate("document.querySelector('#turn-2').innerText"),
            "bare": await page.evaluate(BARE),
            "head": await page.evaluate("document.querySelector('#turn-2 .turn-head').innerText"),
        }

    seen = asyncio.run(browse(chromium, scenario))
    text = seen["text"]
    assert seen["bare"] == [] and seen["running"] == "running"
    assert "claude-code · attempt 2" in seen["head"] and "complete" in seen["head"]
    assert "claude-x" in seen["head"] and "900 in / 80 out" in seen["head"]
    assert "$0.0200" in seen["head"] and "gateway 910 in / 80 out, 1 request" in seen["head"]
    assert "sess-7 resumed" in text
    assert "Looking at\nthe orders." in text or "Looking at the orders." in text
    assert "grep -rn order src/" in text
    assert "network denied" in text and "evil.example:443" in text
    assert "model fallback: b served a" in text
    assert "edit src/orders.py" in text and '"file": "o.py"' in text
    assert "denied (once) by api:acme:ceo" in text and "not that file" in text
    assert "api:acme:ceo said (steer, delivered native):" in text and "use the v2 client" in text
    assert "orders.lookup" in text and '{"id": 7}' in text
    assert "tool result (error, 12 ms): no such order" in text
    assert "900 in / 80 out (300 cached) · $0.0200" in text
    assert "served by claude-x-2" in text
    assert "2 files changed, +12 -3 lines" in text and "+ src/new.py" in text
    assert "~ src/o.py" in text
    assert "turn complete: Fixed the lookup." in text and "exit 0" in text
    assert "usage (grader)" in text and "400 in / 20 out" in text
    assert "iteration 1: not satisfied" in text and "r0123456789abcdef01234567" in text
    assert "<b>the v2 tests</b> still fail" in text  # the feedback stays text


def test_the_runs_list_filters_and_opens_a_run_by_a_page_link(
    api: ApiProcess,  # noqa: F811
    chromium: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    key = api.add_tenant("lister")
    with api.client("lister") as http:
        blue = start(http, "@text the blue one\n@complete blue", labels={"team": "blue"})
        red = start(http, "@text the red one\n@complete red", labels={"team": "red"})
        wait_terminal(http, blue, 1)
        wait_terminal(http, red, 1)
    rows = "[...document.querySelectorAll('#rows tr')].map(r => r.dataset.run)"

    async def scenario(page: Page) -> dict[str, Any]:
        await page.open(f"{api.url}/runs")
        await page.until("document.querySelector('#list-status').innerText.includes('key')")
        await page.evaluate(
            f"document.querySelector('#key').value = {json.dumps(key)};"
            "document.querySelector('#key-form').requestSubmit()"
        )
        await page.until(f"{rows}.length === 2")
        both = await page.evaluate(rows)
        await page.evaluate(
            "document.querySelector('#f-label').value = 'team=blue';"
            "document.querySelector('#filters').requestSubmit()"
        )
        await page.until(f"{rows}.length === 1")
        filtered = await page.evaluate(rows)
        await page.screenshot(screens(tmp_path) / "runs-list.png")
        await page.evaluate(
            "document.querySelector('#f-status').value = 'failed';"
            "document.querySelector('#filters').requestSubmit()"
        )
        await page.until("document.querySelector('#list-status').innerText === 'no run matches'")
        seen = {
            "both": both,
            "filtered": filtered,
            "field": await page.evaluate("document.querySelector('#key').value"),
            "stored": await page.evaluate("sessionStorage.getItem('harness-api-key')"),
            "href": await page.evaluate("location.href"),
        }
        await page.evaluate(
            "document.querySelector('#f-status').value = '';"
            "document.querySelector('#filters').requestSubmit()"
        )
        await page.until(f"{rows}.length === 1")
        await page.evaluate("document.querySelector('#rows tr button.open-read').click()")
        await page.until(f"location.pathname === '/runs/{blue}'")
        await page.until(f"document.querySelector('#events') && {EVENTS}.includes('the blue one')")
        seen["run_href"] = await page.evaluate("location.href")
        seen["steer"] = await page.evaluate("document.querySelector('#steer').hidden")
        return seen

    seen = asyncio.run(browse(chromium, scenario))
    assert sorted(seen["both"]) == sorted([blue, red]) and seen["filtered"] == [blue]
    assert seen["field"] == "" and seen["stored"] == key  # kept for the tab, not in the field
    assert key not in seen["href"] and key not in seen["run_href"]
    assert "link=" not in seen["run_href"] and seen["steer"] is True  # a read link
    page = httpx.get(f"{api.url}/runs")
    assert (
        page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    )


def _route(method: str, path: str) -> bool:
    return any(
        getattr(r, "path", None) == path and method in getattr(r, "methods", ())
        for r in routes.router.routes
    )


STEER = ("POST", "/v1/runs/{run_id}/messages")


@pytest.mark.skipif(
    not (_route(*STEER) and STEER in links.ROUTES["approve"]),
    reason="POST /v1/runs/{id}/messages (and an approve link's right to it) not there yet",
)
def test_the_steer_box_sends_a_message_and_says_when_the_run_has_ended(
    api: ApiProcess,  # noqa: F811
    chromium: str,  # noqa: F811
) -> None:
    with api.client("acme") as http:
        run_id = start(http, "@text waiting\n@sleep 30\n@complete slept")
        url = open_link(http, run_id, "approve")

        async def scenario(page: Page) -> tuple[str, str]:
            await page.open(url)
            await page.until(f"{EVENTS}.includes('waiting')")
            send = (
                "document.querySelector('#steer-text').value = 'stop sleeping';"
                "document.querySelector('#steer-mode').value = 'queue';"
                "document.querySelector('#steer-form').requestSubmit()"
            )
            await page.evaluate(send)
            result = "document.querySelector('#steer-result').innerText"
            await page.until(f"{result}.startsWith('accepted')")
            accepted: str = await page.evaluate(result)
            http.delete(f"/v1/runs/{run_id}")
            await page.until("document.querySelector('#status').innerText.includes('ended')")
            await page.evaluate(send)
            await page.until(f"{result}.startsWith('not sent')")
            refused: str = await page.evaluate(result)
            return accepted, refused

        accepted, refused = asyncio.run(browse(chromium, scenario))
    assert "202" in accepted
    assert "409" in refused


# Each attempt writes answer.txt with a line of its own (after markup that must stay text).
ATTEMPT = (
    "@text writing answer.txt\n"
    "@run python3 -c open('answer.txt','w').write('<img/src=x/onerror=window.pwned=3>'"
    "+__import__('uuid').uuid4().hex[:8]+'\\n')\n"
    "@usage 120 30 0.004\n@complete wrote answer.txt"
)
COLUMNS = "[...document.querySelectorAll('#attempts .attempt')]"


def test_a_real_group_is_shown_as_columns_diffed_and_picked(
    api: ApiProcess,  # noqa: F811
    chromium: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Three attempts of the demo harness started with ``POST /v1/runs`` (attempts 3): the
    first one's page (a read link) shows the group as columns and opens another attempt
    through the runs list (with the key); the runs list shows the diff of two as text and
    picks one (the others are ended); a fork of the picked one names its parent."""
    key = api.add_tenant("grouper")
    with api.client("grouper") as http:
        made = http.post("/v1/runs", json={**RUN, "input": ATTEMPT, "attempts": 3})
        assert made.status_code == 201, made.text
        group, runs = made.json()["group"], made.json()["runs"]
        assert len(runs) == 3 and made.json()["run_id"] == runs[0]
        for run_id in runs:
            assert wait_terminal(http, run_id, 1)["type"] == "turn-complete"
        url = open_link(http, runs[0], "read")

    async def scenario(page: Page) -> dict[str, Any]:
        await page.open(url)
        done = f"{COLUMNS}.filter(c => c.innerText.includes('wrote answer.txt')).length === 3"
        await page.until(f"{COLUMNS}.length === 3 && {done}")
        await page.until(f"{EVENTS}.includes('turn complete: wrote answer.txt')")
        await page.screenshot(screens(tmp_path) / "group-attempts.png")
        seen: dict[str, Any] = {
            "columns": await page.evaluate(f"{COLUMNS}.map(c => c.innerText)"),
            "runs": await page.evaluate(f"{COLUMNS}.map(c => c.dataset.run)"),
            "current": await page.evaluate(f"{COLUMNS}.map(c => c.classList.contains('current'))"),
            "opens": await page.evaluate(
                f"{COLUMNS}.map(c => c.querySelector('a.open-attempt')?.getAttribute('href'))"
            ),
            "picks": await page.evaluate(
                "document.querySelectorAll('#attempts button.pick').length"
            ),
            "facts": await page.evaluate("document.querySelector('#facts').innerText"),
        }
        # Another attempt opens through the runs list: the key, then a link made for it.
        await page.evaluate(f"{COLUMNS}[1].querySelector('a.open-attempt').click()")
        await page.until("location.pathname === '/runs'")
        await page.until("document.querySelector('#list-status').innerText.includes('to open')")
        await page.evaluate(
            f"document.querySelector('#key').value = {json.dumps(key)};"
            "document.querySelector('#key-form').requestSubmit()"
        )
        await page.until(f"location.pathname === '/runs/{runs[1]}'")
        await page.until("document.querySelector('#facts').innerText.includes('attempt 2')")
        await page.until(f"{COLUMNS}.length === 3")
        seen["second"] = await page.evaluate(f"{COLUMNS}.map(c => c.classList.contains('current'))")
        seen["second_href"] = await page.evaluate("location.href")
        # The runs list with the key: the diff of two, then a pick.
        await page.open(f"{api.url}/runs#group={group}")
        await page.until(f"{COLUMNS}.length === 3 && document.querySelector('#diff-form')")
        await page.evaluate(
            "document.querySelector('#diff-a').value = '1';"
            "document.querySelector('#diff-b').value = '3';"
            "document.querySelector('#diff-form').requestSubmit()"
        )
        diff = "document.querySelector('#group-diff')"
        await page.until(f"!{diff}.hidden && {diff}.innerText.includes('answer.txt')")
        seen["diff"] = await page.evaluate(f"{diff}.textContent")
        seen["diff_lines"] = await page.evaluate(
            f"[...{diff}.querySelectorAll('span.plus, span.minus')].map(s => s.textContent)"
        )
        pick = f"{COLUMNS}[1].querySelector('button.pick')"
        await page.evaluate(f"{pick}.click()")
        await page.screenshot(screens(tmp_path) / "group-diff-and-pick.png")
        seen["confirm"] = await page.evaluate(f"{pick}.innerText")
        seen["picked_early"] = http_picked(api, group)
        await page.evaluate(f"{pick}.click()")
        state = "document.querySelector('#group-state').innerText"
        await page.until(f"{state}.startsWith('picked attempt 2')")
        await page.until(f"{COLUMNS}.length === 3 && {COLUMNS}[1].classList.contains('picked')")
        seen["state"] = await page.evaluate(state)
        seen["picked"] = await page.evaluate(f"{COLUMNS}.map(c => c.classList.contains('picked'))")
        seen["picks_after"] = await page.evaluate(
            "document.querySelectorAll('#attempts button.pick').length"
        )
        seen["images"] = await page.evaluate("document.querySelectorAll('img').length")
        seen["pwned"] = await page.evaluate("typeof window.pwned")
        seen["list_href"] = await page.evaluate("location.href")
        return seen

    seen = asyncio.run(browse(chromium, scenario))
    assert seen["runs"] == runs and seen["current"] == [True, False, False]
    assert seen["picks"] == 0  # a page link cannot pick
    assert f"group\n{group} · attempt 1" in seen["facts"]
    for n, text in enumerate(seen["columns"], 1):
        assert f"attempt {n} complete" in text and runs[n - 1] in text
        assert "stdio-json" in text and "demo-1" in text and "wrote answer.txt" in text
        assert "1 file, +1 / -0 lines" in text and "120 in / 30 out" in text
        assert "$0.0040" in text
        for word in ("undefined", "null", "NaN", "[object Object]"):
            assert word not in text
    assert "this run" in seen["columns"][0]
    assert seen["opens"][0] is None
    assert seen["opens"][1] == f"/runs#open={runs[1]}&mode=read&group={group}"
    assert seen["second"] == [False, True, False]
    assert key not in seen["second_href"] and "link=" not in seen["second_href"]
    # The diff of attempts 1 and 3: each one's line, shown as the text it is.
    assert "answer.txt" in seen["diff"]
    marked = [line for line in seen["diff_lines"] if "<img/src=x/onerror=window.pwned=3>" in line]
    assert [line[0] for line in marked] == ["-", "+"]
    assert seen["images"] == 0 and seen["pwned"] == "undefined"
    # The pick asked to be confirmed, and only the second click picked.
    assert seen["confirm"] == "pick attempt 2: end the others?" and seen["picked_early"] is None
    assert runs[0] in seen["state"] and runs[2] in seen["state"]
    assert seen["picked"] == [False, True, False] and seen["picks_after"] == 0
    assert key not in seen["list_href"]
    with api.client("grouper") as http:
        assert http.get(f"/v1/groups/{group}").json()["picked"] == 2
        for run_id in (runs[0], runs[2]):
            assert http.delete(f"/v1/runs/{run_id}").json()["status"] == "ended"


def http_picked(api: ApiProcess, group: str) -> Any:  # noqa: F811
    with api.client("grouper") as http:
        return http.get(f"/v1/groups/{group}").json()["picked"]


def test_a_real_fork_names_its_parent(
    api: ApiProcess,  # noqa: F811
    chromium: str,  # noqa: F811
) -> None:
    """A real fork (``POST /v1/runs/{id}/fork``) of a two-turn run at its turn 1: the fork's
    page and its row on the runs list say which run and turn it was forked from."""
    key = api.keys["acme"]
    with api.client("acme") as http:
        parent = start(http, "hello")  # plain turns: the fork's replay holds no script line
        wait_terminal(http, parent, 1)
        assert http.post(f"/v1/runs/{parent}/turns", json={"input": "and again"}).status_code == 202
        wait_terminal(http, parent, 2)
        forked = http.post(
            f"/v1/runs/{parent}/fork", json={"input": "@complete forked on", "at_turn": 1}
        )
        assert forked.status_code == 201, forked.text
        fork = forked.json()["run_id"]
        assert wait_terminal(http, fork, 1)["type"] == "turn-complete"
        record = http.get(f"/v1/runs/{fork}").json()
        assert record["forked_from"] == parent and record["forked_at_turn"] == 1
        url = open_link(http, fork)

    async def scenario(page: Page) -> dict[str, str]:
        await page.open(url)
        await page.until(f"{EVENTS}.includes('turn complete: forked on')")
        await page.until("document.querySelector('#facts').innerText.includes('forked from')")
        facts: str = await page.evaluate("document.querySelector('#facts').innerText")
        await page.open(f"{api.url}/runs")
        await page.until("document.querySelector('#list-status').innerText.includes('key')")
        await page.evaluate(
            f"document.querySelector('#key').value = {json.dumps(key)};"
            "document.querySelector('#key-form').requestSubmit()"
        )
        row = f"document.querySelector('#rows tr[data-run=\"{fork}\"]')"
        await page.until(f"{row} !== null")
        listed: str = await page.evaluate(f"{row}.innerText")
        return {"facts": facts, "listed": listed}

    seen = asyncio.run(browse(chromium, scenario))
    assert "forked from" in seen["facts"] and f"{parent} at turn 1" in seen["facts"]
    assert f"forked from {parent} at turn 1" in seen["listed"]
    with api.client("acme") as http:
        for run_id in (parent, fork):
            http.delete(f"/v1/runs/{run_id}")
