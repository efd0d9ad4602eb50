#!/usr/bin/env python3
"""harness-demo: a harness that speaks the stdio-json protocol, for the demo and the tests.

Standard library only, so it runs in the tiny demo image. It reads the turn input on stdin.
Plain input gets a plain answer: a session line, narration, one activity, usage, and a
``complete`` line. Input lines that start with ``@`` are a script instead, run in order:

  @text WORDS            an assistant text line
  @activity KIND DESC    a sandbox activity (command, file, tool, other)
  @permission DESC       a permission request; with HARNESS_POSTURE=ask it waits for the
                         decision line on stdin and says what it was told
  @ask CMD ARGS...       ask to run a command (a permission request with that command);
                         with HARNESS_POSTURE=ask runs it only when allowed, else never
  @usage IN OUT [COST]   a usage line
  @sleep SECONDS         pause (a slow or hanging harness)
  @stream N [DELAY]      N text lines, DELAY seconds apart
  @flood N               N small usage-free text lines as fast as possible
  @stamp N               N text lines carrying the wall clock (for latency benchmarks)
  @bigline BYTES         one line of that many bytes (not valid JSON at the end)
  @fill BYTES [LINE]     BYTES of text lines of LINE bytes each (default 1024), as fast as
                         possible; line i's text starts with i as ten digits (big streams)
  @garbage               a non-JSON line, a JSON array, and invalid UTF-8
  @stderr TEXT           a line on stderr
  @env NAME              print the named environment variable (to test secret isolation)
  @model KEY MODEL TEXT  ask MODEL for TEXT through HARNESS_MODEL_BASE_URL (OpenAI Chat
                         Completions, streamed) with the key in variable KEY: its answer as a
                         text line and its usage as a usage line; an error line (terminal)
                         with what the API answered when it refused
  @try-model KEY MODEL TEXT  the same, but a refusal is a text line and the script goes on
  @tool SERVER TOOL JSON call TOOL of the MCP server SERVER of HARNESS_MCP_CONFIG with the
                         JSON arguments (launching the server as a stdio MCP client does);
                         a text line "tool SERVER.TOOL ok|error: RESULT"
  @tools SERVER          a text line naming the server's tools
  @run CMD ARGS...       run a command and report it as activity with its output
  @allocate MIB          hold that many MiB of memory (to meet a memory limit)
  @ignore-term           ignore SIGTERM from now on
  @fork N                start N children that ignore SIGTERM and sleep
  @wait-message SECONDS  wait up to SECONDS for a message line on stdin (``harness steer``,
                         with HARNESS_POSTURE=ask: the only posture whose stdin stays open)
                         and answer with a text line "message: TEXT"; a text line "no
                         message" when none came (without ask it only waits)
  @stamp-messages N SECS the same for up to N message lines, each answered at once by a text
                         line "TIME message: TEXT", TIME the wall clock when it was read
                         (for steer latency benchmarks); stops at the first SECS without one
  @error MESSAGE         an error line (terminal)
  @limit N REASON [S]    the first N times this line runs in the run (counted in $HOME): an
                         error line with that reason (rate-limited, quota, ...) and
                         retry_after_s S when given (terminal); later, nothing
  @complete TEXT         a complete line (terminal)
  @exit CODE             exit now, without a terminal line
  @twice                 two complete lines (the second must be dropped)
  @attachments           a text line per file in HARNESS_ATTACHMENTS: path, media type,
                         size, and the SHA-256 of the bytes read from that path
  @answer-attachments    a complete line whose text is the JSON object {"attachments":
                         [{"path", "media_type", "sha256"}]} of those files (a structured
                         answer; ``@complete {...}`` answers with any given JSON)

With HARNESS_POSTURE=ask the input comes as the first stdin line, ``{"type":"input",
"text":...}``, and stdin stays open for decision lines (stdio-json protocol).

Sessions live in $HOME/.demo-sessions: a resumed turn (HARNESS_RESUME_SESSION) continues
the named session when it exists and fails with code ``session-not-found`` when it does not.
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

STUBBORN_CHILD = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
)


def emit(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def session_dir() -> Path:
    return Path(os.environ.get("HOME", "/tmp")) / ".demo-sessions"


def open_session() -> tuple[str, int]:
    """The session id and how many turns it has seen; exits when a resume is refused."""
    wanted = os.environ.get("HARNESS_RESUME_SESSION")
    folder = session_dir()
    if wanted:
        path = folder / wanted
        if not path.exists():
            emit({"type": "error", "message": f"no session {wanted}", "code": "session-not-found"})
            sys.exit(1)
        turns = int(path.read_text() or "0")
        return wanted, turns
    return "demo-" + uuid.uuid4().hex[:12], 0


def save_session(session_id: str, turns: int) -> None:
    folder = session_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / session_id).write_text(str(turns))


def plain_answer(text: str, turns: int) -> str:
    words = text.split()
    emit({"type": "text", "text": f"Thinking about your {len(words)}-word message…"})
    time.sleep(0.2)
    emit({"type": "activity", "kind": "command", "description": "wc -w input.txt"})
    time.sleep(0.2)
    answer = f"You said: {text.strip()[:200]}" + (
        f" (turn {turns} of this session)" if turns else ""
    )
    emit({"type": "text", "text": answer})
    emit({"type": "usage", "input_tokens": len(words) + 12, "output_tokens": 9, "cost_usd": 0.0})
    return answer


def fill(total: int, line_bytes: int) -> None:
    """``total`` bytes of text lines, each ``line_bytes`` long with its newline."""
    head, tail = b'{"type":"text","text":"', b'"}\n'
    pad = b"x" * max(0, line_bytes - len(head) - len(tail) - 11)
    out = sys.stdout.buffer
    block: list[bytes] = []
    i = written = 0
    while written < total:
        line = b"%s%010d %s%s" % (head, i, pad, tail)
        block.append(line)
        written += len(line)
        i += 1
        if len(block) == 256:
            out.write(b"".join(block))
            block.clear()
    out.write(b"".join(block))
    out.flush()


def limited(line: str, times: int) -> bool:
    """Whether ``line`` still fails: it has run fewer than ``times`` times in this HOME."""
    folder = Path(os.environ.get("HOME", "/tmp")) / ".demo-limits"
    folder.mkdir(parents=True, exist_ok=True)
    counter = folder / hashlib.sha256(line.encode()).hexdigest()[:16]
    seen = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(seen + 1))
    return seen < times


def asking() -> bool:
    return os.environ.get("HARNESS_POSTURE") == "ask"


def ask(description: str, command: str | None) -> dict[str, object] | None:
    """Emit a permission line; with HARNESS_POSTURE=ask wait for its decision line (stdin
    closing first is a deny). None when not asking (the request is only reported)."""
    request_id = uuid.uuid4().hex[:8]
    line: dict[str, object] = {"type": "permission", "id": request_id}
    line.update(description=description, command=command)
    if command is not None:
        line["tool"] = "bash"  # a command runs through the shell tool (rules name it so)
    emit(line)
    if not asking():
        return None
    while True:
        line = sys.stdin.readline()
        if not line:
            return {"decision": "deny", "message": "stdin closed before a decision"}
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if message.get("type") == "decision" and message.get("id") == request_id:
            if message.get("abort"):
                sys.exit(1)  # the turn is ending: stop here
            return message


def read_input() -> str:
    if asking():
        first = sys.stdin.readline()
        try:
            return str(json.loads(first).get("text", ""))
        except ValueError:
            return first
    return sys.stdin.buffer.read().decode("utf-8", errors="replace")


Directive = Callable[[str, list[str], str], None]
"""One ``@NAME rest`` line of a script: called with ``rest``, its words, and the whole line."""


def _text(rest: str, args: list[str], raw: str) -> None:
    emit({"type": "text", "text": rest})


def _activity(rest: str, args: list[str], raw: str) -> None:
    kind = args[0] if args else "other"
    emit({"type": "activity", "kind": kind, "description": " ".join(args[1:])})


def _permission(rest: str, args: list[str], raw: str) -> None:
    decision = ask(rest, None)
    if decision is not None:
        said = decision.get("decision")
        note = f" ({decision['message']})" if decision.get("message") else ""
        emit({"type": "text", "text": f"{said}: {rest}{note}"})


def _ask(rest: str, args: list[str], raw: str) -> None:
    decision = ask(f"run {rest}", rest)
    if decision is None or decision.get("decision") == "allow":
        result = subprocess.run(args, capture_output=True, text=True, check=False)
        emit({"type": "activity", "kind": "command", "description": rest})
        emit({"type": "text", "text": (result.stdout + result.stderr).strip()})
    else:
        note = decision.get("message") or "denied"
        emit({"type": "text", "text": f"not running {rest}: {note}"})


def _usage(rest: str, args: list[str], raw: str) -> None:
    cost = float(args[2]) if len(args) > 2 else None
    emit(
        {
            "type": "usage",
            "input_tokens": int(args[0]),
            "output_tokens": int(args[1]),
            "cost_usd": cost,
        }
    )


def _sleep(rest: str, args: list[str], raw: str) -> None:
    time.sleep(float(args[0]))


def _wait_message(rest: str, args: list[str], raw: str) -> None:
    seconds = float(args[0]) if args else 30.0
    if not asking():
        time.sleep(seconds)
        emit({"type": "text", "text": "no message"})
        return
    arrived = next_message(seconds)
    if arrived is None:
        emit({"type": "text", "text": "no message"})
    else:
        emit({"type": "text", "text": f"message: {arrived[0]}"})


def _stamp_messages(rest: str, args: list[str], raw: str) -> None:
    count = int(args[0]) if args else 1
    seconds = float(args[1]) if len(args) > 1 else 30.0
    if not asking():
        time.sleep(seconds)
        emit({"type": "text", "text": "no message"})
        return
    for _ in range(count):
        arrived = next_message(seconds)
        if arrived is None:
            emit({"type": "text", "text": "no message"})
            return
        text, at = arrived
        emit({"type": "text", "text": f"{at:.6f} message: {text}"})


def next_message(seconds: float) -> tuple[str, float] | None:
    """The text of the next ``message`` line on stdin within ``seconds``, and the wall clock
    when it was read; None when none came or stdin closed."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin], [], [], left)
        if not ready:
            break
        line = sys.stdin.readline()
        at = time.time()
        if not line:
            break
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and message.get("type") == "message":
            return str(message.get("text", "")), at
    return None


def _stream(rest: str, args: list[str], raw: str) -> None:
    delay = float(args[1]) if len(args) > 1 else 0.1
    for i in range(int(args[0])):
        emit({"type": "text", "text": f"line {i}"})
        time.sleep(delay)


def _flood(rest: str, args: list[str], raw: str) -> None:
    out = sys.stdout
    for i in range(int(args[0])):
        out.write(f'{{"type":"text","text":"flood {i}"}}\n')
    out.flush()


def _stamp(rest: str, args: list[str], raw: str) -> None:
    for i in range(int(args[0])):
        emit({"type": "text", "text": f"{time.time():.6f} {i}"})
        time.sleep(float(args[1]) if len(args) > 1 else 0.005)


def _bigline(rest: str, args: list[str], raw: str) -> None:
    size = int(args[0])
    chunk = b"x" * (1 << 20)
    sys.stdout.buffer.write(b'{"type":"text","text":"')
    while size > 0:
        sys.stdout.buffer.write(chunk[: min(size, len(chunk))])
        size -= len(chunk)
    sys.stdout.buffer.write(b"\n")
    sys.stdout.buffer.flush()


def _fill(rest: str, args: list[str], raw: str) -> None:
    fill(int(args[0]), int(args[1]) if len(args) > 1 else 1024)


def _garbage(rest: str, args: list[str], raw: str) -> None:
    sys.stdout.write("this is a banner, not JSON\n[1, 2, 3]\n")
    sys.stdout.flush()
    sys.stdout.buffer.write(b'{"type":"text","text":"bad \xff\xfe bytes"}\n')
    sys.stdout.buffer.flush()


def _stderr(rest: str, args: list[str], raw: str) -> None:
    sys.stderr.write(rest + "\n")
    sys.stderr.flush()


def _env(rest: str, args: list[str], raw: str) -> None:
    emit({"type": "text", "text": f"{args[0]}={os.environ.get(args[0], '<unset>')}"})


def _model(rest: str, args: list[str], raw: str) -> None:
    _ask_model(args, tolerate=False)


def _try_model(rest: str, args: list[str], raw: str) -> None:
    _ask_model(args, tolerate=True)


def _ask_model(args: list[str], *, tolerate: bool) -> None:
    import urllib.error
    import urllib.request

    base = os.environ.get("HARNESS_MODEL_BASE_URL", "")
    body = {
        "model": args[1],
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": " ".join(args[2:]) or "hello"}],
    }
    request = urllib.request.Request(
        base.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {os.environ.get(args[0], '')}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            text, usage = [], None
            for line in response:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    text.append((choice.get("delta") or {}).get("content") or "")
                usage = chunk.get("usage") or usage
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:500]
        if tolerate:
            emit({"type": "text", "text": f"model API {exc.code}: {detail}"})
            return
        emit({"type": "error", "message": f"model API {exc.code}: {detail}"})
        sys.exit(0)
    except OSError as exc:
        emit({"type": "error", "message": f"model API unreachable: {exc}"})
        sys.exit(0)
    emit({"type": "text", "text": "".join(text)})
    if usage:
        emit(
            {
                "type": "usage",
                "input_tokens": usage.get("prompt_tokens", 0),
                "output_tokens": usage.get("completion_tokens", 0),
            }
        )


def mcp_session(server: str) -> tuple[subprocess.Popen[bytes], Callable[..., dict[str, Any]]]:
    """A stdio MCP client of ``server`` (HARNESS_MCP_CONFIG), initialized; its process and a
    request function (method, params) -> the response."""
    config = json.loads(Path(os.environ["HARNESS_MCP_CONFIG"]).read_text())["mcpServers"][server]
    proc = subprocess.Popen(
        [config["command"], *config.get("args", [])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, **config.get("env", {})},
    )
    assert proc.stdin is not None and proc.stdout is not None
    ids = iter(range(1, 1_000_000))

    def request(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        number = next(ids)
        message = {"jsonrpc": "2.0", "id": number, "method": method, "params": params or {}}
        proc.stdin.write(json.dumps(message).encode() + b"\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        for line in proc.stdout:  # type: ignore[union-attr]
            answer: dict[str, Any] = json.loads(line)
            if answer.get("id") == number:
                return answer
        raise RuntimeError(f"MCP server {server} closed the connection")

    client = {"name": "harness-demo", "version": "1"}
    request(
        "initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
    )
    proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
    proc.stdin.flush()
    return proc, request


def _tool(rest: str, args: list[str], raw: str) -> None:
    server, tool, *arguments = rest.split(" ", 2)
    try:
        proc, request = mcp_session(server)
        answer = request(
            "tools/call", {"name": tool, "arguments": json.loads(" ".join(arguments) or "{}")}
        )
        proc.kill()
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        emit({"type": "text", "text": f"tool {server}.{tool} error: {exc}"})
        return
    result = answer.get("result") or {}
    text = "".join(c.get("text", "") for c in result.get("content", []))
    outcome = "error" if result.get("isError") or "error" in answer else "ok"
    emit({"type": "text", "text": f"tool {server}.{tool} {outcome}: {text or answer.get('error')}"})


def _tools(rest: str, args: list[str], raw: str) -> None:
    try:
        proc, request = mcp_session(args[0])
        listed = request("tools/list")["result"]["tools"]
        proc.kill()
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        emit({"type": "text", "text": f"tools {args[0]} error: {exc}"})
        return
    emit({"type": "text", "text": f"tools {args[0]}: {' '.join(t['name'] for t in listed)}"})


def _run(rest: str, args: list[str], raw: str) -> None:
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    emit({"type": "activity", "kind": "command", "description": " ".join(args)})
    emit({"type": "text", "text": (result.stdout + result.stderr).strip()})


def _allocate(rest: str, args: list[str], raw: str) -> None:
    held = bytearray(int(args[0]) * 1024 * 1024)
    for i in range(0, len(held), 4096):
        held[i] = 1  # touch every page so it is really resident
    emit({"type": "text", "text": f"holding {args[0]} MiB"})
    _HELD.append(held)


_HELD: list[bytearray] = []
"""What ``@allocate`` holds until the process exits."""


def _ignore_term(rest: str, args: list[str], raw: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _fork(rest: str, args: list[str], raw: str) -> None:
    for _ in range(int(args[0])):
        subprocess.Popen([sys.executable, "-c", STUBBORN_CHILD])


def _error(rest: str, args: list[str], raw: str) -> None:
    emit({"type": "error", "message": rest or "scripted failure"})


def _limit(rest: str, args: list[str], raw: str) -> None:
    if limited(raw, int(args[0])):
        error: dict[str, object] = {"type": "error", "reason": args[1]}
        error["message"] = f"scripted limit: {args[1]}"
        if len(args) > 2:
            error["retry_after_s"] = float(args[2])
        emit(error)
        sys.exit(0)


def _complete(rest: str, args: list[str], raw: str) -> None:
    emit({"type": "complete", "text": rest})


def _exit(rest: str, args: list[str], raw: str) -> None:
    sys.exit(int(args[0]) if args else 0)


def attachments() -> list[dict[str, object]]:
    """The files HARNESS_ATTACHMENTS names, each with the SHA-256 of what is at its path."""
    seen = []
    for entry in json.loads(os.environ.get("HARNESS_ATTACHMENTS") or "[]"):
        data = Path(entry["path"]).read_bytes()
        seen.append({**entry, "sha256": hashlib.sha256(data).hexdigest(), "read": len(data)})
    return seen


def _attachments(rest: str, args: list[str], raw: str) -> None:
    for entry in attachments():
        text = f"attachment {entry['path']} {entry['media_type']} {entry['size']} {entry['sha256']}"
        emit({"type": "text", "text": text})


def _answer_attachments(rest: str, args: list[str], raw: str) -> None:
    files = [
        {"path": e["path"], "media_type": e["media_type"], "sha256": e["sha256"]}
        for e in attachments()
    ]
    emit({"type": "complete", "text": json.dumps({"attachments": files})})


def _twice(rest: str, args: list[str], raw: str) -> None:
    emit({"type": "complete", "text": "first"})
    emit({"type": "complete", "text": "second"})


DIRECTIVES: dict[str, Directive] = {
    "text": _text,
    "activity": _activity,
    "permission": _permission,
    "ask": _ask,
    "usage": _usage,
    "sleep": _sleep,
    "stream": _stream,
    "wait-message": _wait_message,
    "stamp-messages": _stamp_messages,
    "flood": _flood,
    "stamp": _stamp,
    "bigline": _bigline,
    "fill": _fill,
    "garbage": _garbage,
    "stderr": _stderr,
    "env": _env,
    "model": _model,
    "try-model": _try_model,
    "tool": _tool,
    "tools": _tools,
    "run": _run,
    "allocate": _allocate,
    "ignore-term": _ignore_term,
    "fork": _fork,
    "error": _error,
    "limit": _limit,
    "complete": _complete,
    "exit": _exit,
    "twice": _twice,
    "attachments": _attachments,
    "answer-attachments": _answer_attachments,
}
"""Every directive of a script, by name (an unknown one is skipped)."""


def run_script(lines: list[str]) -> None:
    for raw in lines:
        name, _, rest = raw[1:].partition(" ")
        directive = DIRECTIVES.get(name)
        if directive is not None:
            directive(rest, rest.split(), raw)


def main() -> None:
    data = read_input()
    session_id, turns = open_session()
    turns += 1
    save_session(session_id, turns)
    emit({"type": "session", "id": session_id, "model": "demo-1"})
    script = [line for line in data.splitlines() if line.startswith("@")]
    if script:
        run_script(script)
        terminal = ("@complete", "@error", "@twice", "@answer-attachments")
        if not any(line.split()[0] in terminal for line in script):
            emit({"type": "complete", "text": "script done"})
        return
    answer = plain_answer(data, turns if turns > 1 else 0)
    emit({"type": "complete", "text": answer})


if __name__ == "__main__":
    main()
