"""Atomic file writes: a crash leaves either the old file or the new one, never a torn one;
text files whose name ends in ``.gz`` are gzip-compressed (large result tables stay small
enough for git)."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from typing import Callable


def atomic_write(path: str, write: Callable, binary: bool = False) -> None:
    """Call ``write(fh)`` on a temporary file beside ``path``, fsync it, then rename it over."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make results unreadable to others
    try:
        with os.fdopen(fd, "wb" if binary else "w") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: str, text: str) -> None:
    """Write ``text`` atomically; gzip-compressed when ``path`` ends in ``.gz``, with no
    timestamp in the header, so the same text always gives the same bytes (a committed file's
    sha256 names its content)."""
    if path.endswith(".gz"):
        data = gzip.compress(text.encode(), mtime=0)
        atomic_write(path, lambda fh: fh.write(data), binary=True)
    else:
        atomic_write(path, lambda fh: fh.write(text))


def open_text(path: str):
    """Open ``path`` for reading text, decompressing it when its name ends in ``.gz``."""
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def write_json(path: str, obj, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON atomically (non-finite floats become null)."""
    text = json.dumps(nonfinite_to_none(obj), indent=indent, default=_default)
    atomic_write(path, lambda fh: fh.write(text + "\n"))


def nonfinite_to_none(obj):
    """``obj`` with every nan or infinite float replaced by None (JSON has no nan or inf).

    Dicts, lists and tuples are copied recursively (tuples become lists); other values are
    returned unchanged, so numpy scalars and arrays are left to the JSON encoder.
    """
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: nonfinite_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [nonfinite_to_none(v) for v in obj]
    return obj


def _default(obj):
    try:
        import numpy as np
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
