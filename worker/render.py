"""How the ``harness`` command shows events: human lines, or one JSON object per line."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO


class Renderer:
    def __init__(self, json_output: bool, stream: TextIO | None = None) -> None:
        self.json = json_output
        self.out = stream or sys.stdout

    def _line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def accepted(self, run_id: str, turn: int) -> None:
        if self.json:
            self._line(json.dumps({"run_id": run_id, "turn": turn}))
        elif turn == 1:
            self._line(run_id)
        else:
            self._line(f"{run_id} turn {turn}")

    def message(self, payload: dict[str, Any], text: str) -> None:
        self._line(json.dumps(payload) if self.json else text)

    def record(self, record: dict[str, Any]) -> None:
        if self.json:
            self._line(json.dumps(record))
            return
        width = max(len(k) for k in record)
        for key, value in record.items():
            shown = json.dumps(value) if isinstance(value, dict | list) else value
            self._line(f"{key:<{width}}  {'' if shown is None else shown}")

    def event(self, event: Any) -> None:
        if self.json:
            self._line(json.dumps(event.as_dict(), ensure_ascii=False))
            return
        data = event.data
        kind = event.type
        if kind == "turn-started":
            self._line(f"── turn {event.turn} · {data.get('harness')} ──")
        elif kind == "session":
            resumed = " (resumed)" if data.get("resumed") else ""
            model = data.get("model") or "model not reported"
            self._line(f"· session {data.get('session_id')}{resumed} · {model}")
        elif kind == "assistant-text":
            self._line(str(data.get("text", "")))
        elif kind == "sandbox-activity":
            marks = {"command": "$", "file": "✎", "tool": "⚙"}
            self._line(f"  {marks.get(data.get('kind', ''), '·')} {data.get('description', '')}")
        elif kind == "permission-request":
            self._line(f"  ? permission: {data.get('description')} {data.get('command') or ''}")
        elif kind == "usage":
            cost = data.get("cost_usd")
            priced = f" · ${cost:.6f}" if isinstance(cost, int | float) else ""
            source = " (replay)" if data.get("source") == "replay" else ""
            self._line(
                f"  · tokens in {data.get('input_tokens')} out {data.get('output_tokens')}"
                f"{priced}{source}"
            )
        elif kind == "turn-complete":
            self._line(f"✓ turn {event.turn} complete")
        elif kind == "session-error":
            self._line(f"✗ turn {event.turn} failed ({data.get('reason')}): {data.get('error')}")
        else:
            self._line(f"{kind} {json.dumps(data)}")

    def summary(self, record: dict[str, Any], terminal: Any) -> None:
        if self.json:
            return
        cost = record.get("cost_usd")
        self._line(
            f"status {record.get('status')} · turns {record.get('turns')} · tokens "
            f"{record.get('input_tokens')}/{record.get('output_tokens')} · cost "
            f"{'n/a' if cost is None else f'${cost:.6f}'} · model "
            f"{record.get('model_reported') or 'not reported'} · session "
            f"{record.get('session_id') or '-'}"
        )
