"""Reading a file the user named, or one in a folder others can write to, without being
held up by what is there instead: a FIFO (the open or the read waits for a writer
forever), a device (``/dev/zero`` never ends) or a link swapped in after a check."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

__all__ = ["NOT_REGULAR", "open_regular", "read_regular"]

NOT_REGULAR = "not a regular file"


def open_regular(path: str | os.PathLike[str], *, follow: bool = True) -> BinaryIO:
    """``path`` opened for reading, only if it is a regular file (``fstat`` of what was
    opened, so a swap after any earlier check is seen); opened non-blocking, so a FIFO
    never waits for a writer. ``follow=False``: a symbolic link is refused too
    (``O_NOFOLLOW``). ValueError naming ``NOT_REGULAR``; OSError when it cannot be opened."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(NOT_REGULAR)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_regular(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file at ``path``; ValueError when it is not one or holds
    more than ``limit`` bytes (nothing past ``limit + 1`` is read)."""
    with open_regular(path) as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data
