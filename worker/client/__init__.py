"""The producer's side: :class:`HarnessClient` (CONTRACT.md, "Python API for producers") and
the workspace requests it sends to a run's host."""

from worker.client.harness import HarnessClient, StreamEvent, Waiting

__all__ = ["HarnessClient", "StreamEvent", "Waiting"]
