"""Permission requests a harness hands to us live (``--posture ask``), as adapter values.

A mapper that meets a request the harness waits on appends an :class:`Ask` to
``state.asks`` and publishes nothing itself: the worker gives it a request id and a
deadline, publishes the ``permission-request`` event, keeps it in Redis until a person, a
service or the deadline answers, and then calls the adapter's
``answer(state, ask, decision)``, which appends the harness's reply to ``state.outbox``.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Ask:
    """One request the harness waits on.

    ``native_id`` is the harness's own handle (a JSON-RPC id, a control request id, a
    stdio-json ``id``), never shown to producers. ``tool`` and ``input`` are what the harness
    wants to run; ``reply`` holds what the adapter needs to answer (option ids, the original
    input to send back).
    """

    native_id: Any
    tool: str
    input: Any
    description: str = ""
    command: str | None = None
    reply: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """The answer to one :class:`Ask`: ``allow`` or not; ``always`` when the producer allowed
    it for the rest of the run; ``message`` is told to the model on a deny; ``abort`` when the
    turn is ending (cancel, timeout, shutdown) and the harness should stop rather than go
    on."""

    allow: bool
    always: bool = False
    message: str | None = None
    abort: bool = False


DENIED_MESSAGE = "The tool call was denied by the operator of this run."
