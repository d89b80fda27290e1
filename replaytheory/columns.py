"""Compact containers for per-item records: numpy columns instead of Python objects.

A Python dict of lists costs ~250 bytes per item for five small integers; these containers
cost the numpy bytes of the values plus at most ~25% slack (and 9 bytes per id). numpy only.

* ``IdTable``: columns keyed by unique integer ids, found by binary search over the ids kept
  sorted (items are numbered in increasing order by every producer here, so inserts append);
  deleted rows are dropped at the next reallocation.
* ``IntRing``: a double-ended queue of integers in a growable ring buffer.
"""

from __future__ import annotations

import numpy as np

SLACK = 1.25  # allocated rows per needed row after a reallocation


class IdTable:
    """Rows of typed columns keyed by unique int64 ids.

    Args: columns: name -> numpy dtype. Row indices (``rows``) stay valid until the next
    ``insert``, which may reorder or compact the storage.
    """

    def __init__(self, columns: dict):
        self._dtypes = {k: np.dtype(d) for k, d in columns.items()}
        self._alloc(8)

    def _alloc(self, size: int) -> None:
        self.ids = np.empty(size, dtype=np.int64)
        self.live = np.zeros(size, dtype=bool)
        self.cols = {k: np.empty(size, dtype=d) for k, d in self._dtypes.items()}
        self._used = self._n = 0

    def __len__(self) -> int:
        return self._n

    def _reallocate(self, extra: int) -> None:
        """Move the live rows (in id order) into storage with room for ``extra`` more."""
        keep = np.flatnonzero(self.live[:self._used])
        keep = keep[np.argsort(self.ids[keep], kind="stable")]
        ids, cols = self.ids[keep], {k: c[keep] for k, c in self.cols.items()}
        self._alloc(max(8, int(SLACK * (keep.size + extra))))
        n = keep.size
        self.ids[:n], self.live[:n] = ids, True
        for k, c in cols.items():
            self.cols[k][:n] = c
        self._used = self._n = n

    def _search(self, ids: np.ndarray) -> np.ndarray:
        """Positions of ``ids`` among the stored ones (any row, live or not; -1 if absent)."""
        if not self._used:
            return np.full(ids.shape, -1, dtype=np.int64)
        stored = self.ids[:self._used]
        pos = np.searchsorted(stored, ids).clip(max=self._used - 1)
        return np.where(stored[pos] == ids, pos, -1)

    def contains(self, ids) -> np.ndarray:
        """Whether each id is held (live)."""
        pos = self._search(np.asarray(ids, dtype=np.int64))
        return (pos >= 0) & self.live[np.maximum(pos, 0)]

    def insert(self, ids, **values) -> None:
        """Add rows (ids not held; every column given, scalar or per id)."""
        ids = np.atleast_1d(np.asarray(ids, dtype=np.int64))
        n = ids.size
        if n == 0:
            return
        last = self.ids[self._used - 1] if self._used else np.iinfo(np.int64).min
        in_order = ids[0] > last and bool(np.all(np.diff(ids) > 0))
        if not in_order or self._used + n > self.ids.size:
            # A reallocation drops deleted rows (ids may come back) and restores id order.
            self._reallocate(n)
            last = self.ids[self._used - 1] if self._used else np.iinfo(np.int64).min
            in_order = ids[0] > last and bool(np.all(np.diff(ids) > 0))
        sl = slice(self._used, self._used + n)
        self.ids[sl], self.live[sl] = ids, True
        for k, c in self.cols.items():
            c[sl] = values[k]
        self._used += n
        self._n += n
        if not in_order:
            self._reallocate(0)

    def rows(self, ids) -> np.ndarray:
        """Row index of each held id; KeyError for an id not held."""
        ids = np.asarray(ids, dtype=np.int64)
        pos = self._search(ids)
        bad = (pos < 0) | ~self.live[np.maximum(pos, 0)]
        if np.any(bad):
            raise KeyError(f"ids not held: {ids[bad][:5].tolist()}")
        return pos

    def delete(self, ids) -> np.ndarray:
        """Drop held ids; returns their rows (readable until the next ``insert``)."""
        rows = self.rows(ids)
        self.live[rows] = False
        self._n -= np.unique(rows).size
        return rows

    def live_rows(self) -> np.ndarray:
        """Rows of the held ids, in increasing id order."""
        return np.flatnonzero(self.live[:self._used])

    def nbytes(self) -> int:
        """Bytes of the storage arrays."""
        return self.ids.nbytes + self.live.nbytes + sum(c.nbytes for c in self.cols.values())


class IntRing:
    """Double-ended queue of int64 in a ring buffer that grows by ``SLACK`` when full."""

    def __init__(self, values=()):
        values = np.asarray(values, dtype=np.int64)
        self._buf = np.empty(max(8, int(SLACK * values.size)), dtype=np.int64)
        self._buf[:values.size] = values
        self._head, self._n = 0, values.size

    def __len__(self) -> int:
        return self._n

    def append(self, value: int) -> None:
        """Add ``value`` at the right end."""
        if self._n == self._buf.size:
            values = self.array()
            self._buf = np.empty(int(SLACK * self._n) + 1, dtype=np.int64)
            self._buf[:self._n] = values
            self._head = 0
        self._buf[(self._head + self._n) % self._buf.size] = value
        self._n += 1

    def popleft(self) -> int:
        """Remove and return the leftmost value."""
        if not self._n:
            raise IndexError("pop from an empty IntRing")
        value = int(self._buf[self._head])
        self._head = (self._head + 1) % self._buf.size
        self._n -= 1
        return value

    def peekleft(self) -> int:
        """The leftmost value (not removed)."""
        if not self._n:
            raise IndexError("peek into an empty IntRing")
        return int(self._buf[self._head])

    def pop(self) -> int:
        """Remove and return the rightmost value."""
        if not self._n:
            raise IndexError("pop from an empty IntRing")
        self._n -= 1
        return int(self._buf[(self._head + self._n) % self._buf.size])

    def discard(self, values) -> np.ndarray:
        """Remove every held value found in ``values`` (order of the rest kept); returns the
        values removed."""
        held = self.array()
        gone = np.isin(held, np.asarray(values, dtype=np.int64))
        if gone.any():
            kept = held[~gone]
            self._buf[:kept.size] = kept
            self._head, self._n = 0, kept.size
        return held[gone]

    def array(self) -> np.ndarray:
        """The values left to right (a copy)."""
        end = self._head + self._n
        if end <= self._buf.size:
            return self._buf[self._head:end].copy()
        return np.concatenate([self._buf[self._head:], self._buf[:end - self._buf.size]])

    def nbytes(self) -> int:
        """Bytes of the ring's storage."""
        return self._buf.nbytes
