"""The producer's side: :class:`HarnessClient` (README.md, "Using it"; docs/events.md,
"Reading events") and the workspace requests it sends to a run's host."""

from worker.client.harness import HarnessClient
from worker.client.reading import StreamEvent, Waiting

__all__ = ["HarnessClient", "StreamEvent", "Waiting"]
