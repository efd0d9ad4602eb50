"""Small state files that change every turn (a run's metadata, its lease, a moved git ref),
rewritten in place.

Not truncated to nothing and written again, nor replaced by a new file renamed over them:
ext4 flushes a file truncated to zero as it is closed, and a file renamed over another as it
is renamed (``auto_da_alloc``), 0.3-1.4 ms a write on this project's machines against ~10 us
in place, and a turn wrote five such files. A reader that catches one half written reads
what does not parse (JSON, an object id) and takes it for absent, as its owner's readers do
for a missing file; the next write makes it whole.
"""

from __future__ import annotations

import os
from pathlib import Path


def rewrite_in_place(path: Path, data: bytes, *, create: bool = True) -> bool:
    """Make ``path`` hold ``data``; with ``create=False`` only a file that exists (False and
    nothing written when there is none)."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        if create:
            raise
        return False
    try:
        if os.pwrite(fd, data, 0) != len(data):
            raise OSError(f"short write to {path}")
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    return True
