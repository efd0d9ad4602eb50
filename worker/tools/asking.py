"""Under ``--posture ask``, the run's endpoint asks before it makes a call, for a harness
whose CLI does not ask for MCP tool calls itself (capability ``mcp_ask`` false).

The request is the same durable permission request the turn's :class:`~worker.permissions.
requests.Gate` makes (the run's ``permissions`` hash, answered by ``harness approve``/``deny``,
first answer wins, ``--always`` remembered, the run's ``--allow``/``--deny`` patterns first),
published as ``permission-request`` and ``permission-decision`` events through the turn's
queue. The tool is named ``mcp__SERVER__TOOL``. No answer by the deadline, or the turn ending,
is a deny.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from adapters.asks import DENIED_MESSAGE, Ask
from adapters.events import Event, PermissionDecision, PermissionRequest
from worker.observe.masking import Masker
from worker.permissions import requests as permissions
from worker.permissions import rules
from worker.store.errors import REDIS_ERRORS
from worker.store.keys import Keys, SyncRedis

log = logging.getLogger(__name__)

FIRST_NUMBER = 9000
"""The endpoint's requests are ``p{turn}-9001`` on: apart from the harness's own (from 1)."""
POLL_S = 0.2


class EndpointAsk:
    """Asks for each call of one turn's endpoint; :meth:`close` denies what still waits."""

    def __init__(
        self,
        client: SyncRedis,
        keys: Keys,
        run_id: str,
        turn: int,
        *,
        timeout_s: float,
        masker: Masker,
        put: Callable[[Event], None],
        allow: tuple[str, ...] = (),
        deny: tuple[str, ...] = (),
    ) -> None:
        self.client, self.keys, self.run_id, self.turn = client, keys, run_id, turn
        self.timeout_s, self.masker, self.put = timeout_s, masker, put
        self.allow, self.deny = allow, deny
        self._count = FIRST_NUMBER
        self._lock = threading.Condition()
        self._waiting = 0
        self._closed = threading.Event()

    def __call__(self, server: str, tool: str, arguments: dict[str, Any]) -> str | None:
        """None when the call may be made; else what the harness is told. Blocks."""
        name = f"mcp__{server}__{tool}"
        ask = Ask(native_id=None, tool=name, input=arguments, description=f"{tool} ({server})")
        with self._lock:
            self._count += 1
            request_id = f"p{self.turn}-{self._count}"
            self._waiting += 1
        try:
            return self._ask(request_id, ask)
        finally:
            with self._lock:
                self._waiting -= 1
                self._lock.notify_all()

    def close(self, wait_s: float = 5.0) -> None:
        """The turn is ending: what waits is denied (its decision published before the
        turn's terminal)."""
        self._closed.set()
        with self._lock:
            self._lock.wait_for(lambda: self._waiting == 0, wait_s)

    def _ask(self, request_id: str, ask: Ask) -> str | None:
        text, size = permissions.shown_input(ask.input, self.masker)
        deadline = time.time() + self.timeout_s
        self.put(
            PermissionRequest(
                request_id=request_id, description=ask.description, tool=ask.tool,
                input=text, input_chars=size, deadline=deadline,
            )
        )  # fmt: skip
        ruled = rules.decide(self.allow, self.deny, ask)
        print_ = permissions.fingerprint(ask.tool, ask.input)
        if ruled is not None:
            allowed, by = ruled
            message = None if allowed else f"Denied by the run's rule {by.split(':', 2)[2]}."
            answer = {"decision": "allow" if allowed else "deny", "by": by, "message": message}
        elif self.client.sismember(self.keys.permission_always(self.run_id), print_):
            answer = {"decision": "allow", "scope": "always", "by": "rule:always"}
        else:
            record = {
                "request_id": request_id, "run_id": self.run_id, "turn": self.turn,
                "n": int(request_id.rsplit("-", 1)[1]), "tool": ask.tool,
                "description": ask.description, "command": None, "input": text,
                "input_chars": size, "deadline": deadline, "asked_at": time.time(),
            }  # fmt: skip
            self.client.hset(self.keys.permissions(self.run_id), request_id, json.dumps(record))
            answer = self._wait(request_id, deadline)
        return self._decided(request_id, answer, print_)

    def _wait(self, request_id: str, deadline: float) -> dict[str, Any]:
        key = self.keys.permission_answers(self.run_id)
        while True:
            try:
                [text] = self.client.hmget(key, [request_id])
            except REDIS_ERRORS:
                text = None
            if text is not None:
                loaded: dict[str, Any] = json.loads(text)
                return loaded
            if time.time() >= deadline or self._closed.is_set():
                return self._close(request_id, deadline)
            self._closed.wait(POLL_S)

    def _close(self, request_id: str, deadline: float) -> dict[str, Any]:
        """The worker answers: a deny (unless a person's answer got in first)."""
        by = "worker:deadline" if time.time() >= deadline else "worker:turn-ended"
        denial = {"decision": "deny", "scope": "once", "by": by, "message": None, "at": time.time()}
        try:
            status, detail = permissions.close_request(
                self.client, self.keys, self.run_id, request_id, json.dumps(denial)
            )
        except REDIS_ERRORS:
            return denial
        if status == "answered" and not self._closed.is_set():
            won: dict[str, Any] = json.loads(detail)
            return won
        return denial

    def _decided(self, request_id: str, answer: dict[str, Any], print_: str) -> str | None:
        allow = answer.get("decision") == "allow"
        always = allow and answer.get("scope") == "always"
        if always and answer.get("by") != "rule:always":
            self.client.sadd(self.keys.permission_always(self.run_id), print_)
        by = str(answer.get("by") or "unknown")
        message = answer.get("message") or None
        if by == "worker:deadline":
            message = f"No answer within {self.timeout_s:g}s: the tool call was denied."
        self.put(
            PermissionDecision(
                request_id=request_id, decision="allow" if allow else "deny",
                scope="always" if always else "once", by=by, message=message,
            )
        )  # fmt: skip
        log.info(
            "permission.decided",
            extra={"run_id": self.run_id, "request_id": request_id, "by": by, "allow": allow},
        )
        return None if allow else (message or DENIED_MESSAGE)
