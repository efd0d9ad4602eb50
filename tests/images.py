"""Small real images, built byte by byte, for the attachment tests (no imaging library).

Each is a well-formed file of its format: its magic bytes, then a header that says how large
the picture is (what :func:`worker.options.attachments.image_size` reads), then its data.
"""

from __future__ import annotations

import struct
import zlib


def png(width: int = 3, height: int = 2) -> bytes:
    """Red pixels, 8-bit RGB."""
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def gif() -> bytes:
    """One red pixel."""
    return (
        b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\x00\x00\x00\x00\x00"
        b"!\xf9\x04\x01\x00\x00\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
    )


def jpeg(width: int = 3, height: int = 2) -> bytes:
    """A baseline JPEG's markers: SOI, a JFIF APP0, the SOF0 frame header, EOI."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    components = b"\x01\x11\x00\x02\x11\x01\x03\x11\x01"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + components
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xd9"


def webp(width: int = 3, height: int = 2) -> bytes:
    """A lossless (VP8L) WebP header."""
    bits = (width - 1) | ((height - 1) << 14)
    payload = b"\x2f" + bits.to_bytes(4, "little") + b"\x00" * 5
    chunk = b"VP8L" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", 4 + len(chunk)) + b"WEBP" + chunk
