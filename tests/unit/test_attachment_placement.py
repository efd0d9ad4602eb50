"""The worker's side of a turn's attachments (worker/workspace/attachments.py): read back from
Redis, checked again against the message and the operator's bounds, written into the workspace
at ``.attachments/turn-N/`` without ever following a link the agent put there."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import fakeredis
import pytest

from config import Settings
from sandbox.store.snapshots import SnapshotStore
from tests.images import png
from worker.errors import InvalidInput
from worker.options.spec import AttachmentRef
from worker.store.keys import Keys
from worker.store.transfer import BinaryRedis, push_bytes
from worker.workspace.attachments import place
from worker.workspace.steps import RunWorkspace

RUN = "r" + "a" * 24
KEYS = Keys("t")
NOTES = b"remember the milk\n"


@pytest.fixture
def binary() -> BinaryRedis:
    client: BinaryRedis = fakeredis.FakeRedis(decode_responses=False)  # type: ignore[assignment]
    return client


@pytest.fixture
def work(tmp_path: Path) -> RunWorkspace:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return RunWorkspace(RUN, workspace, SnapshotStore(tmp_path, RUN), os.getuid(), os.getgid())


def ref(name: str, data: bytes, media_type: str) -> AttachmentRef:
    return AttachmentRef(
        name=name,
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        media_type=media_type,  # type: ignore[arg-type]
    )


def upload(binary: BinaryRedis, turn: int, *files: bytes) -> None:
    for index, data in enumerate(files):
        push_bytes(binary, KEYS.attachment(RUN, turn, index), data, 60)


SETTINGS = Settings(attach_max_bytes=1000, attach_max_files=2, attach_max_total_bytes=1500)


def test_the_files_are_written_at_their_turns_place_and_named_to_the_adapter(
    binary: BinaryRedis, work: RunWorkspace
) -> None:
    upload(binary, 3, png(), NOTES)
    refs = [ref("red.png", png(), "image/png"), ref("notes.txt", NOTES, "application/octet-stream")]
    placed = place(binary, KEYS, work, 3, refs, SETTINGS)
    folder = work.path / ".attachments" / "turn-3"
    assert (folder / "red.png").read_bytes() == png()
    assert (folder / "notes.txt").read_bytes() == NOTES
    assert [(a.path, a.media_type, a.size, a.image) for a in placed] == [
        (".attachments/turn-3/red.png", "image/png", len(png()), True),
        (".attachments/turn-3/notes.txt", "application/octet-stream", len(NOTES), False),
    ]
    assert placed[0].data == png() and placed[1].data == b""  # only an image rides inline
    assert not binary.llen(KEYS.attachment(RUN, 3, 0))  # read once, then gone


def test_what_an_earlier_try_of_the_turn_left_is_replaced(
    binary: BinaryRedis, work: RunWorkspace
) -> None:
    stale = work.path / ".attachments" / "turn-1"
    stale.mkdir(parents=True)
    (stale / "old.txt").write_text("from before")
    upload(binary, 1, NOTES)
    place(binary, KEYS, work, 1, [ref("notes.txt", NOTES, "application/octet-stream")], SETTINGS)
    assert sorted(p.name for p in stale.iterdir()) == ["notes.txt"]


def test_a_link_the_agent_put_in_place_of_the_folder_is_refused_never_followed(
    binary: BinaryRedis, work: RunWorkspace, tmp_path: Path
) -> None:
    outside = tmp_path / "etc"
    outside.mkdir()
    (work.path / ".attachments").symlink_to(outside)
    upload(binary, 1, NOTES)
    with pytest.raises(InvalidInput, match="could not be written"):
        place(
            binary, KEYS, work, 1, [ref("notes.txt", NOTES, "application/octet-stream")], SETTINGS
        )
    assert list(outside.iterdir()) == []


def test_bytes_that_are_not_what_the_message_says_are_refused(
    binary: BinaryRedis, work: RunWorkspace
) -> None:
    upload(binary, 1, NOTES)
    with pytest.raises(InvalidInput, match="does not match its SHA-256"):
        place(
            binary,
            KEYS,
            work,
            1,
            [ref("notes.txt", b"x" * len(NOTES), "application/octet-stream")],
            SETTINGS,
        )
    upload(binary, 2, NOTES)
    with pytest.raises(InvalidInput, match="is application/octet-stream, not the image/png"):
        place(binary, KEYS, work, 2, [ref("notes", NOTES, "image/png")], SETTINGS)
    with pytest.raises(InvalidInput, match="uploaded attachment is gone"):
        place(
            binary, KEYS, work, 3, [ref("notes.txt", NOTES, "application/octet-stream")], SETTINGS
        )
    assert not (work.path / ".attachments").exists()


def test_the_workers_own_bounds_hold_whatever_the_client_allowed(
    binary: BinaryRedis, work: RunWorkspace
) -> None:
    big = b"y" * 1001
    upload(binary, 1, big)
    with pytest.raises(InvalidInput, match="HARNESS_ATTACH_MAX_BYTES"):
        place(binary, KEYS, work, 1, [ref("big.bin", big, "application/octet-stream")], SETTINGS)
    three = [ref(f"f{i}.txt", NOTES, "application/octet-stream") for i in range(3)]
    with pytest.raises(InvalidInput, match="HARNESS_ATTACH_MAX_FILES"):
        place(binary, KEYS, work, 1, three, SETTINGS)
    assert place(binary, KEYS, work, 1, [], SETTINGS) == ()
