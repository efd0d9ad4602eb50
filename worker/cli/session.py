"""What a ``harness`` command's handler is given: its arguments, its renderer, and a client
made on first use (``doctor``, ``reap`` and the operator's commands make none)."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from worker.cli.render import Renderer

if TYPE_CHECKING:
    from worker.client import HarnessClient


class Session:
    """One command's arguments, with its renderer and its client."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    @functools.cached_property
    def renderer(self) -> Renderer:
        return Renderer(json_output=getattr(self.args, "json", False))

    @functools.cached_property
    def client(self) -> HarnessClient:
        """The producer's client, from the settings (InvalidSettings when they are not)."""
        from worker.client import HarnessClient

        return HarnessClient()


Handler = Callable[[argparse.Namespace, Session], int]
"""A command: its parsed arguments and session in, its exit status out."""
