"""A turn's attachments, from Redis into the run's workspace, checked again by the worker.

The producer's client checked them (:mod:`worker.options.attachments`); the worker trusts no
message it is handed, so each file's bytes are read back, their size, SHA-256, name and type
checked against the operator's bounds and the message's facts, and only then written, at
``.attachments/turn-N/NAME``, through :class:`sandbox.store.safe_fs.SafeWriter` (the agent
owns the workspace: a ``.attachments`` it replaced with a link to ``/etc`` is refused, never
followed).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

from adapters.protocol import Attachment
from config import Settings
from sandbox.base import UnsafePath
from sandbox.store.safe_fs import READ_FLAGS, SafeWriter
from worker.errors import InvalidInput
from worker.options import attachments as checks
from worker.options.policy import attachment_limits
from worker.options.spec import AttachmentRef
from worker.store.keys import Keys
from worker.store.transfer import BinaryRedis, push_bytes, read_bytes
from worker.workspace.steps import RunWorkspace


def turn_dir(turn: int) -> str:
    return f"{checks.ATTACHMENTS_DIR}/turn-{turn}"


def place(
    client: BinaryRedis,
    keys: Keys,
    work: RunWorkspace,
    turn: int,
    refs: Sequence[AttachmentRef],
    settings: Settings,
) -> tuple[Attachment, ...]:
    """Write the turn's attachments into its workspace; what its request names.

    InvalidInput (the turn is refused) when one is gone, breaks a bound, is not what its
    message said, or cannot be written without following a link.
    """
    if not refs:
        return ()
    limits = attachment_limits(settings)
    checks.check_count(len(refs), limits)
    checks.check_names([ref.name for ref in refs])
    placed, total = [], 0
    for index, ref in enumerate(refs):
        total += ref.size
        checks.check_size(ref.name, ref.size, total, limits)
        data = read_bytes(client, keys.attachment(work.run_id, turn, index), ref.sha256, ref.size)
        if len(data) != ref.size or checks.safe_name(ref.name) != ref.name:
            raise InvalidInput(f"attachment {ref.name!r} is not what the turn's message says")
        found = checks.media_type(ref.name, data)
        if found != ref.media_type:
            raise InvalidInput(
                f"attachment {ref.name!r} is {found}, not the {ref.media_type} its message says"
            )
        placed.append((ref, data))
    folder = turn_dir(turn)
    try:
        with SafeWriter(work.path, work.uid, work.gid) as writer:
            writer.remove(folder)  # what an earlier try of this turn left
            for ref, data in placed:
                writer.write_file(f"{folder}/{ref.name}", [data], executable=False)
    except UnsafePath as exc:
        raise InvalidInput(f"the turn's attachments could not be written: {exc}") from None
    return tuple(
        Attachment(
            path=f"{folder}/{ref.name}",
            media_type=ref.media_type,
            size=ref.size,
            data=data if ref.media_type.startswith("image/") else b"",
        )
        for ref, data in placed
    )


def carry(
    client: BinaryRedis,
    keys: Keys,
    work: RunWorkspace,
    turn: int,
    next_turn: int,
    refs: Sequence[AttachmentRef],
    ttl_s: int,
) -> bool:
    """Upload a turn's attachments again for ``next_turn`` (its parked retry), read back from
    where :func:`place` wrote them, never through a link, each checked against its message's
    SHA-256 (the agent may have changed it). False, and nothing uploaded, when one is gone or
    changed: the retry is then refused as a turn whose attachment is gone."""
    if not refs:
        return True
    found: list[bytes] = []
    try:
        with SafeWriter(work.path, work.uid, work.gid) as writer:
            folder = writer.directory(turn_dir(turn), create=False)
            for ref in refs:
                fd = os.open(ref.name, READ_FLAGS, dir_fd=folder)
                with os.fdopen(fd, "rb") as file:
                    data = file.read(ref.size + 1)
                if len(data) != ref.size or hashlib.sha256(data).hexdigest() != ref.sha256:
                    return False
                found.append(data)
    except (OSError, UnsafePath):
        return False
    for index, data in enumerate(found):
        push_bytes(client, keys.attachment(work.run_id, next_turn, index), data, ttl_s)
    return True
