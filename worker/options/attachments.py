"""A turn's attachments as the operator bounds them: names, sizes, counts, and what an image is.

The client checks every file before anything is uploaded; the worker checks the uploaded
bytes again before it writes them into the run's workspace. An image is known by its bytes,
never by its name: PNG, JPEG, GIF and WebP each open with their own magic bytes, and their
header must say how large the picture is. A file named as an image whose bytes are not that
image (``photo.png`` holding a JPEG, or text) is refused as mislabeled; an image whose header
cannot be read (cut short, corrupt) is refused as unreadable. Any other file travels as
``application/octet-stream``.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from worker.errors import InvalidInput

OCTET_STREAM = "application/octet-stream"
IMAGE_TYPES: tuple[str, ...] = ("image/png", "image/jpeg", "image/gif", "image/webp")
SUFFIX_TYPES: dict[str, str] = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}
"""The names that claim an image: their bytes must be that image."""
_TYPE_NAMES = {"image/png": "PNG", "image/jpeg": "JPEG", "image/gif": "GIF", "image/webp": "WebP"}
ATTACHMENTS_DIR = ".attachments"
"""Where a turn's attachments are written in the run's workspace: ``.attachments/turn-N/NAME``."""
_NAME = re.compile(r"[A-Za-z0-9._-]")


@dataclass(frozen=True)
class AttachmentLimits:
    """The operator's bounds (HARNESS_ATTACH_MAX_BYTES, _MAX_FILES, _MAX_TOTAL_BYTES)."""

    max_bytes: int
    max_files: int
    max_total_bytes: int


def sniff(data: bytes) -> str | None:
    """The image type the bytes open with, or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_size(data: bytes, media_type: str) -> tuple[int, int]:
    """Width and height from an image's header; ValueError when it cannot be read."""
    if media_type == "image/png":
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ValueError("no PNG header (IHDR)")
        width, height = struct.unpack(">II", data[16:24])
    elif media_type == "image/gif":
        if len(data) < 13:
            raise ValueError("the GIF header is cut short")
        width, height = struct.unpack("<HH", data[6:10])
    elif media_type == "image/webp":
        width, height = _webp_size(data)
    else:
        width, height = _jpeg_size(data)
    if width <= 0 or height <= 0:
        raise ValueError(f"the header says {width}x{height} pixels")
    return width, height


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    raise ValueError("no WebP frame header (VP8, VP8L or VP8X)")


_JPEG_FRAMES = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg_size(data: bytes) -> tuple[int, int]:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            raise ValueError("a JPEG segment does not start with 0xFF")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if marker in _JPEG_FRAMES:
            if at + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        if length < 2:
            raise ValueError("a JPEG segment has no length")
        at += 2 + length
    raise ValueError("no JPEG frame header (SOF) before the data ends")


def safe_name(name: str) -> str:
    """The file's name as it is written in the workspace: its base name, each character but
    letters, digits, '.', '_' and '-' replaced by '_', never hidden, at most 100 characters."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = "".join(c if _NAME.fullmatch(c) else "_" for c in base)[-100:]
    cleaned = cleaned.lstrip(".-") or "attachment"
    return cleaned


def media_type(name: str, data: bytes) -> str:
    """What the attachment is, from its bytes; InvalidInput for a mislabeled or unreadable
    image."""
    found = sniff(data)
    claimed = SUFFIX_TYPES.get("." + name.rsplit(".", 1)[-1].lower()) if "." in name else None
    if claimed is not None and found != claimed:
        what = f"a {_TYPE_NAMES[found]} image" if found else "not an image"
        raise InvalidInput(
            f"attachment {name!r} is named as a {_TYPE_NAMES[claimed]} image but its bytes are "
            f"{what} (images are known by their content; rename it or attach the right file)"
        )
    if found is None:
        return OCTET_STREAM
    try:
        image_size(data, found)
    except (ValueError, struct.error) as exc:
        raise InvalidInput(
            f"attachment {name!r} is an unreadable {_TYPE_NAMES[found]} image: {exc}"
        ) from None
    return found


def check_count(count: int, limits: AttachmentLimits) -> None:
    if count > limits.max_files:
        raise InvalidInput(
            f"{count} attachments, over the operator's limit of {limits.max_files} per turn "
            "(HARNESS_ATTACH_MAX_FILES)"
        )


def check_size(name: str, size: int, total: int, limits: AttachmentLimits) -> None:
    """One file of ``size`` bytes, ``total`` the turn's bytes with it."""
    if size == 0:
        raise InvalidInput(f"attachment {name!r} is empty")
    if size > limits.max_bytes:
        raise InvalidInput(
            f"attachment {name!r} is {size} bytes, over the operator's limit of "
            f"{limits.max_bytes} per file (HARNESS_ATTACH_MAX_BYTES)"
        )
    if total > limits.max_total_bytes:
        raise InvalidInput(
            f"the turn's attachments are {total} bytes or more, over the operator's limit of "
            f"{limits.max_total_bytes} (HARNESS_ATTACH_MAX_TOTAL_BYTES)"
        )


def check_names(names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidInput(f"two attachments would both be named {name!r} in the workspace")
        seen.add(name)
