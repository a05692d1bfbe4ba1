"""One column of the per-step summaries, compact over a long run.

A summary column holds one value per step for 100k steps and more. Most of them hardly
change: the peak bytes of each memory category and the bytes of each collective are the
same step after step once a run is warm, and steps count up by one. So the rows older than
the last ``CHUNK`` are sealed in chunks of ``CHUNK`` rows, and a chunk whose rows are all
the same value (bit for bit, NaN included) keeps that one value; a chunk of steps that
count up by one keeps its first. Losses and times keep one 8-byte value a row, as before.

Rows stay writable anywhere (a late event, a roll-back, a row folded in from an engine): a
write that a sealed chunk cannot hold as one value turns that chunk back into an array.
"""

from __future__ import annotations

from array import array
from typing import Any

__all__ = ["CHUNK", "Column"]

CHUNK = 1024  # rows per sealed chunk: small against 100k steps, big against its overhead


class Column:
    """A sequence of numbers, ``array``'s ``typecode`` (``"d"`` values, ``"q"`` steps), with
    the indexing, ``append``, ``insert`` and ``truncate`` the summaries use."""

    __slots__ = ("_chunks", "_tail", "typecode")

    def __init__(self, typecode: str, values: Any = ()) -> None:
        self.typecode = typecode
        # Sealed chunks of CHUNK rows each: an array, or a number standing for all of its
        # rows (for "q": the first of CHUNK consecutive steps, for "d": the one value).
        self._chunks: list[array[Any] | float | int] = []
        self._tail: array[Any] = array(typecode, values)
        self._seal()

    def __len__(self) -> int:
        return len(self._chunks) * CHUNK + len(self._tail)

    def __getitem__(self, i: int) -> Any:
        i, sealed = self._index(i)
        if i >= sealed:
            return self._tail[i - sealed]
        chunk = self._chunks[i // CHUNK]
        if isinstance(chunk, array):
            return chunk[i % CHUNK]
        return chunk + i % CHUNK if self.typecode == "q" else chunk

    def __setitem__(self, i: int, value: Any) -> None:
        i, sealed = self._index(i)
        if i >= sealed:
            self._tail[i - sealed] = value
            return
        k = i // CHUNK
        chunk = self._chunks[k]
        if not isinstance(chunk, array):
            if _same(self.typecode, self[i], value):
                return
            chunk = self._chunks[k] = self._expand(chunk)
        chunk[i % CHUNK] = value

    def _index(self, i: int) -> tuple[int, int]:
        """``i`` counted from the start, and how many rows are sealed."""
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return i, len(self._chunks) * CHUNK

    def append(self, value: Any) -> None:
        self._tail.append(value)
        if len(self._tail) >= 2 * CHUNK:
            self._seal()

    def insert(self, i: int, value: Any) -> None:
        """Rare (a step older than the newest arrives late): the whole column as one array."""
        whole = self.to_array()
        whole.insert(i, value)
        self._chunks, self._tail = [], whole
        self._seal()

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` rows (a roll-back)."""
        if n >= len(self):
            return
        keep, rest = divmod(n, CHUNK)
        if keep < len(self._chunks):
            tail = self._chunks[keep]
            self._tail = self._expand(tail)[:rest] if not isinstance(tail, array) else tail[:rest]
            del self._chunks[keep:]
        else:
            del self._tail[n - len(self._chunks) * CHUNK :]

    def to_array(self) -> array[Any]:
        """Every row as one ``array`` (a copy)."""
        out: array[Any] = array(self.typecode)
        out.frombytes(self.to_numpy().tobytes())
        return out

    def to_numpy(self) -> Any:
        """Every row as one numpy array (a copy: the column's own buffers stay free to
        grow); a uniform chunk is filled by numpy, not row by row."""
        import numpy as np

        dtype = np.int64 if self.typecode == "q" else np.float64
        parts = []
        for chunk in self._chunks:
            if isinstance(chunk, array):
                parts.append(np.frombuffer(chunk, dtype=dtype))
            elif self.typecode == "q":
                parts.append(np.arange(chunk, chunk + CHUNK, dtype=dtype))
            else:
                parts.append(np.full(CHUNK, chunk, dtype=dtype))
        parts.append(np.frombuffer(self._tail, dtype=dtype))
        return np.concatenate(parts)

    def nbytes(self) -> int:
        """The bytes the rows take (a number for a uniform chunk)."""
        size = self._tail.itemsize
        rows = sum(len(c) if isinstance(c, array) else 1 for c in self._chunks)
        return size * (rows + len(self._tail))

    def _expand(self, value: float | int) -> array[Any]:
        if self.typecode == "q":
            return array("q", range(int(value), int(value) + CHUNK))
        return array(self.typecode, [value]) * CHUNK

    def _seal(self) -> None:
        # Keep the newest CHUNK rows (up to 2 * CHUNK - 1) open: they are the ones written.
        tail = self._tail
        while len(tail) >= 2 * CHUNK:
            chunk = tail[:CHUNK]
            self._chunks.append(chunk[0] if _is_uniform(chunk) else chunk)
            tail = tail[CHUNK:]
        self._tail = tail


def _is_uniform(chunk: array[Any]) -> bool:
    if chunk.typecode == "q":
        first = chunk[0]
        return chunk[-1] - first == len(chunk) - 1 and chunk == array(
            "q", range(first, first + len(chunk))
        )
    return chunk.tobytes() == chunk[:1].tobytes() * len(chunk)  # bit for bit: NaN included


def _same(typecode: str, old: Any, new: Any) -> bool:
    if typecode == "q":
        return bool(old == new)
    return array("d", [old]).tobytes() == array("d", [new]).tobytes()
