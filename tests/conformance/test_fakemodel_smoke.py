"""The fake model server against the five real CLIs (raw argv from tests/fakemodel/clis.py), and the
``run_live_turn`` machinery against the stdio-json adapter with tiny scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from adapters.protocol import TurnRequest
from sandbox.base import Placement
from tests.conformance.conftest import RunLiveTurn
from tests.fakemodel import TEXT_ANSWER, USAGE, FakeModelServer
from tests.fakemodel.clis import HARNESSES, raw_invocation, run

API_OF = {
    "claude-code": "anthropic",
    "codex": "responses",
    "gemini": "gemini",
    "opencode": "chat",
    "pi": "chat",
}


@pytest.mark.parametrize("harness", HARNESSES)
def test_real_cli_answers_text_scenario_with_json_lines(
    harness: str, clis: Path, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    home, workspace = tmp_path / "home", tmp_path / "workspace"
    home.mkdir()
    workspace.mkdir()
    invocation = raw_invocation(
        harness, prompt="say hello", home=str(home), base_url=fake_model.url, bin_dir=str(clis)
    )
    result = run(invocation, cwd=str(workspace), timeout=180)

    assert result.exit_code == 0, result.stderr.decode(errors="replace")[-2000:]
    messages = result.json_lines()
    assert messages, result.stdout[-2000:]
    # the answer streams as two deltas ("Hello from " + "the fake model."); gemini prints each
    assert TEXT_ANSWER.split("from ")[1] in result.stdout.decode()
    calls = [r for r in fake_model.model_requests() if r.api == API_OF[harness]]
    assert calls, [r.path for r in fake_model.requests]
    assert all(r.status == 200 for r in calls)


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "harness.py"
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)
    return str(path)


def test_run_live_turn_maps_a_stdio_json_turn_to_events(
    run_live_turn: RunLiveTurn, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    script = _script(
        tmp_path,
        "import json, os, sys, urllib.request\n"
        "prompt = sys.stdin.read()\n"
        f"req = urllib.request.Request({fake_model.url + '/v1/chat/completions'!r},\n"
        "    data=json.dumps({'model': 'm', 'messages': [{'role': 'user', 'content': prompt}]})"
        ".encode(), headers={'content-type': 'application/json'})\n"
        "answer = json.load(urllib.request.urlopen(req))\n"
        "text = answer['choices'][0]['message']['content']\n"
        "print(json.dumps({'type': 'session', 'id': 's-1', 'model': answer['model']}))\n"
        "print('a banner that is not json')\n"
        "print(json.dumps({'type': 'usage', 'input_tokens': answer['usage']['prompt_tokens'],\n"
        "    'output_tokens': answer['usage']['completion_tokens']}))\n"
        "print(json.dumps({'type': 'complete', 'text': text + ' turn ' +"
        " os.environ['HARNESS_TURN']}))\n",
    )
    turn = run_live_turn("stdio-json", TurnRequest(input="hi there", executable=script))

    assert turn.types() == ["turn-started", "session", "usage", "turn-complete"]
    assert turn.complete.text == f"{TEXT_ANSWER} turn 1"
    assert turn.complete.input_tokens == USAGE.input_tokens
    assert turn.exit_code == 0
    assert turn.driver.counters.non_json == 1
    assert [r.path for r in turn.requests] == ["/v1/chat/completions"]
    assert turn.requests[0].user_texts() == ["hi there"]


def test_run_live_turn_keeps_the_workspace_across_turns(
    run_live_turn: RunLiveTurn, live_placement: Callable[[], Placement], tmp_path: Path
) -> None:
    script = _script(
        tmp_path,
        "import json, os, pathlib\n"
        "notes = pathlib.Path('notes.txt')\n"
        "seen = notes.read_text() if notes.exists() else ''\n"
        "notes.write_text(seen + 'x')\n"
        "session = os.environ.get('HARNESS_RESUME_SESSION', 'fresh')\n"
        "print(json.dumps({'type': 'session', 'id': session}))\n"
        "print(json.dumps({'type': 'complete', 'text': seen + 'x'}))\n",
    )
    placement = live_placement()
    first = run_live_turn(
        "stdio-json", TurnRequest(input="1", executable=script), placement=placement
    )
    second = run_live_turn(
        "stdio-json",
        TurnRequest(input="2", turn=2, executable=script, resume_session="fresh"),
        placement=placement,
    )

    assert first.complete.text == "x"
    assert second.complete.text == "xx"
    assert second.of_type("session")[0].resumed is True  # type: ignore[union-attr]
    assert Path(placement.workspace, "notes.txt").read_text() == "xx"


def test_run_live_turn_times_out_a_hung_harness_and_kills_it(
    run_live_turn: RunLiveTurn, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    script = _script(
        tmp_path,
        "import os, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        'print(\'{"type": "text", "text": "working"}\', flush=True)\n'
        "time.sleep(600)\n",
    )
    turn = run_live_turn("stdio-json", TurnRequest(input="x", executable=script), timeout=3)

    assert turn.timed_out
    assert turn.error.reason == "timeout"
    assert turn.types() == ["turn-started", "assistant-text", "session-error"]
    pid = int(pid_file.read_text())
    assert (
        not Path(f"/proc/{pid}").exists()
        or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    )


def test_run_live_turn_ends_a_silent_exit_with_an_exit_error(
    run_live_turn: RunLiveTurn, tmp_path: Path
) -> None:
    script = _script(tmp_path, "import sys\nsys.stderr.write('boom: no model\\n')\nsys.exit(3)\n")
    turn = run_live_turn("stdio-json", TurnRequest(input="x", executable=script))

    assert turn.exit_code == 3
    assert turn.error.reason == "exit"
    assert "boom: no model" in turn.error.stderr_tail
    assert json.loads(turn.error.data_json())["exit_code"] == 3
