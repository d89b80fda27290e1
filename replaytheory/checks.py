"""Input checks shared by every public entry point (not scientific validation: that is
``validate_sim`` and ``llm_experiments.study.validation``).

Each check raises ``ValueError`` whose message names the parameter, the allowed range and the
value received, so that a CLI can print it as a one-line error. A value of the wrong type and
a value out of range get the same range in their messages.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def _fmt(value) -> str:
    return repr(value) if not isinstance(value, float) else f"{value!r}"


def real(name: str, value, lo: float = -math.inf, hi: float = math.inf, *,
         lo_open: bool = False, hi_open: bool = False) -> float:
    """Return ``value`` as a finite float inside [lo, hi] (open ends as asked), else raise."""
    left = "(" if lo_open or math.isinf(lo) else "["
    right = ")" if hi_open or math.isinf(hi) else "]"
    what = f"{name} must be in {left}{lo:g}, {hi:g}{right}"
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise ValueError(f"{what}; got {_fmt(value)}, not a real number")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{what}; got {v!r}, not finite")
    if v < lo or v > hi or (lo_open and v == lo) or (hi_open and v == hi):
        raise ValueError(f"{what}; got {v!r}")
    return v


def positive(name: str, value) -> float:
    """A finite float > 0."""
    return real(name, value, 0.0, math.inf, lo_open=True)


def nonnegative(name: str, value) -> float:
    """A finite float >= 0."""
    return real(name, value, 0.0, math.inf)


def unit_interval(name: str, value) -> float:
    """A finite float in [0, 1]."""
    return real(name, value, 0.0, 1.0)


def integer_range(lo: int | None = None, hi: int | None = None) -> str:
    """The words for the integers in [lo, hi] (None = unbounded on that side)."""
    if lo is None and hi is None:
        return "an integer"
    if hi is None:
        return f"an integer >= {lo}"
    if lo is None:
        return f"an integer <= {hi}"
    return f"an integer in [{lo}, {hi}]"


def integer(name: str, value, lo: int | None = None, hi: int | None = None) -> int:
    """An integer in [lo, hi] (None = unbounded); floats with an integral value are accepted,
    others rejected."""
    what = f"{name} must be {integer_range(lo, hi)}"
    if isinstance(value, bool):
        raise ValueError(f"{what}, got {value!r}")
    if isinstance(value, (numbers.Integral, np.integer)):
        v = int(value)
    elif isinstance(value, (numbers.Real, np.floating)) and math.isfinite(float(value)) \
            and float(value).is_integer():
        v = int(value)
    else:
        raise ValueError(f"{what}, got {_fmt(value)}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ValueError(f"{what}, got {v}")
    return v


def choice(name: str, value, allowed) -> str:
    """One of a fixed set of strings."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, got {value!r}")
    return value


def finite_array(name: str, value, *, min_len: int = 1, nonnegative_values: bool = False,
                 ndim: int = 1) -> np.ndarray:
    """A float array of the given rank, all finite (and >= 0 if asked), at least min_len long."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be an array of real numbers: {exc}") from None
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d array, got shape {arr.shape}")
    if arr.shape[0] < min_len:
        raise ValueError(f"{name} must hold at least {min_len} values, got {arr.shape[0]}")
    if not np.all(np.isfinite(arr)):
        bad = arr[~np.isfinite(arr)].ravel()[0]
        raise ValueError(f"{name} must be finite everywhere, found {bad!r}")
    if nonnegative_values and np.any(arr < 0):
        bad = arr[arr < 0].ravel()[0]
        raise ValueError(f"{name} must be >= 0 everywhere, found {bad!r}")
    return arr
