"""Under ``--posture ask``, the run's endpoint asks before it makes a call, for a harness
whose CLI does not ask for MCP tool calls itself (capability ``mcp_ask`` false).

The request is the turn's own kind of permission request, made by the same owner as the
harness's asks (:class:`worker.permissions.requests.Asker`: the run's ``permissions`` hash,
answered by ``harness approve``/``deny``, first answer wins, ``--always`` remembered, the
run's ``--allow``/``--deny`` patterns first), published as ``permission-request`` and
``permission-decision`` events through the turn's queue. The tool is named
``mcp__SERVER__TOOL``. No answer by the deadline, or the turn ending, is a deny.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from adapters.asks import DENIED_MESSAGE, Ask
from adapters.events import Event
from worker.observe.masking import Masker
from worker.permissions.requests import Answer, Asked, Asker
from worker.store.keys import Keys, SyncRedis

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
        self.asker = Asker(
            client, keys, run_id, turn, timeout_s=timeout_s, masker=masker, allow=allow,
            deny=deny,
        )  # fmt: skip
        self.turn, self.put = turn, put
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
        asked = self.asker.open(request_id, ask)
        self.put(asked.event)
        answer = asked.ruled or self._wait(asked)
        self.put(self.asker.settle(asked, answer))
        return None if answer.allow else (answer.message or DENIED_MESSAGE)

    def _wait(self, asked: Asked) -> Answer:
        while True:
            answer = self.asker.answers([asked.request_id]).get(asked.request_id)
            if answer is not None:
                return answer
            if self._closed.is_set():
                return self.asker.deny(asked.request_id, "worker:turn-ended", abort=True)
            if time.time() >= asked.deadline:
                return self.asker.deny(asked.request_id, "worker:deadline", abort=False)
            self._closed.wait(POLL_S)
