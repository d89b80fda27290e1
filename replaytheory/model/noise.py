"""Staleness-noise models sigma(s) and their horizon averages (theory.md section 4).

A noise model gives the per-sample gradient noise bound sigma^2(s) as a function of the
staleness s >= 0 (in trainer steps) and its average over a staleness horizon H = N/R,

    sigma_bar^2(H) = (1/H) * sum_{s=0}^{H-1} sigma(s)^2            (section 4, "discrete")

extended to real H as the average of the step function s -> sigma^2(floor(s)) over [0, H]
(a buffer whose last insertion block is partly filled), and the continuous approximation

    sigma_bar^2(H) ~ (1/H) * integral_0^H sigma(u)^2 du             (section 5, "continuous").

For the power law sigma(s) = (s/tau)^alpha the continuous form is (H/tau)^(2 alpha)/(2 alpha+1).
Only ratios of sigma_bar^2 matter for the optimal design, so the scale (tau) drops out there;
it matters for the value of the convergence bound.

Assumption A3 asks sigma to be non-decreasing. Measured noise need not be (under PPO clipping it
was flat or falling, theory.md section 8). ``satisfies_a3`` tells, and every design computed
from a model that breaks A3 carries a note that says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
from scipy.special import zeta

from .. import checks

AVERAGES = ("discrete", "continuous")
# How a TabulatedNoise may be used beyond its largest measured staleness: not at all, or with
# sigma^2 held at its last measured value.
EXTRAPOLATIONS = ("none", "hold_last")
# Below this many terms the discrete power-law sum is summed exactly; above, Euler-Maclaurin
# with the zeta constant (relative error < 1e-13 there).
_EXACT_SUM_TERMS = 4096


@runtime_checkable
class NoiseModel(Protocol):
    """What the bound and the design need from a staleness-noise model."""

    default_average: str

    def sigma2(self, s) -> np.ndarray:
        """sigma(s)^2 at staleness s >= 0 (steps), elementwise."""

    def sigma_bar2(self, horizon, average: str | None = None) -> np.ndarray:
        """Average of sigma^2 over staleness horizon H > 0 (steps), elementwise."""

    @property
    def satisfies_a3(self) -> bool:
        """Whether sigma is non-decreasing in staleness (assumption A3)."""

    def to_dict(self) -> dict:
        """A JSON-serialisable description."""


def _check_average(average: str | None, default: str) -> str:
    return default if average is None else checks.choice("average", average, AVERAGES)


def _horizons(horizon) -> np.ndarray:
    h = np.asarray(horizon, dtype=float)
    if np.any(~np.isfinite(h)) or np.any(h <= 0):
        bad = h[~(np.isfinite(h) & (h > 0))].ravel()[0]
        raise ValueError(f"horizon must be finite and in (0, inf), got {bad!r}")
    return h


def _step_average(horizon: np.ndarray, partial_sum, sigma2) -> np.ndarray:
    """(1/H) [sum_{s<floor H} sigma2(s) + frac(H) sigma2(floor H)], the discrete average."""
    n = np.floor(horizon)
    return (partial_sum(n) + (horizon - n) * sigma2(n)) / horizon


A3_NOTE = ("assumption A3 does not hold: the noise model decreases with staleness somewhere, "
           "so the theorem's bound is not guaranteed and the design is an extrapolation of the "
           "model")


def a3_notes(model) -> list[str]:
    """Notes that every result computed from ``model`` must carry (A3 broken, etc.)."""
    return [] if model.satisfies_a3 else [A3_NOTE]


@dataclass(frozen=True)
class PowerLawNoise:
    """sigma(s) = (s / tau)^alpha (theory.md section 5).

    Args:
        alpha: growth exponent, in [0, inf). alpha = 0 is constant noise; alpha >= 1/2 makes
            the optimal design on-policy.
        tau: staleness scale in steps, in (0, inf). Irrelevant to the optimal design.

    Note: sigma(0) = 0 for alpha > 0, so the exact discrete average vanishes for H <= 1;
    the continuous average (the default, as in section 5) is the one the closed form uses.
    """

    alpha: float
    tau: float = 1.0
    default_average: str = field(default="continuous", init=False)

    def __post_init__(self):
        object.__setattr__(self, "alpha", checks.nonnegative("alpha", self.alpha))
        object.__setattr__(self, "tau", checks.positive("tau", self.tau))

    def sigma2(self, s) -> np.ndarray:
        s = np.asarray(s, dtype=float)
        with np.errstate(divide="ignore", over="ignore"):
            return np.power(s / self.tau, 2.0 * self.alpha)

    def _partial_sum(self, n: np.ndarray) -> np.ndarray:
        """sum_{s=0}^{n-1} (s/tau)^(2 alpha) for integer-valued n >= 0."""
        p = 2.0 * self.alpha
        n = np.asarray(n, dtype=float)
        if p == 0.0:
            return n.copy()  # 0^0 = 1: constant noise counts fresh samples too
        out = np.empty_like(n)
        small = n <= _EXACT_SUM_TERMS
        terms = np.power(np.arange(_EXACT_SUM_TERMS + 1, dtype=float), p)
        csum = np.concatenate([[0.0], np.cumsum(terms)])
        out[small] = csum[n[small].astype(np.int64)]
        m = n[~small]
        with np.errstate(over="ignore"):
            out[~small] = m ** (p + 1) / (p + 1) - m ** p / 2 + p * m ** (p - 1) / 12 + zeta(-p)
            return out / self.tau ** p

    def sigma_bar2(self, horizon, average: str | None = None) -> np.ndarray:
        average = _check_average(average, self.default_average)
        h = _horizons(horizon)
        if average == "continuous":
            return np.exp(self.log_sigma_bar2(h, "continuous"))
        return _step_average(h, self._partial_sum, self.sigma2)

    def log_sigma_bar2(self, horizon, average: str | None = None) -> np.ndarray:
        """log sigma_bar^2(H); exact in log space for the continuous form (no overflow)."""
        average = _check_average(average, self.default_average)
        h = _horizons(horizon)
        if average == "continuous":
            a2 = 2.0 * self.alpha
            return a2 * np.log(h / self.tau) - np.log(a2 + 1.0)
        with np.errstate(divide="ignore"):
            return np.log(self.sigma_bar2(h, "discrete"))

    @property
    def satisfies_a3(self) -> bool:
        return True

    def to_dict(self) -> dict:
        return {"model": "power_law", "alpha": self.alpha, "tau": self.tau}


@dataclass(frozen=True)
class ConstantNoise:
    """sigma(s)^2 = sigma2 for every staleness: the on-policy baseline (no staleness penalty).

    Args:
        sigma2_value: the constant squared noise norm, in (0, inf).
    """

    sigma2_value: float = 1.0
    default_average: str = field(default="discrete", init=False)

    def __post_init__(self):
        object.__setattr__(self, "sigma2_value",
                           checks.positive("sigma2_value", self.sigma2_value))

    def sigma2(self, s) -> np.ndarray:
        return np.full(np.shape(s), self.sigma2_value)

    def sigma_bar2(self, horizon, average: str | None = None) -> np.ndarray:
        _check_average(average, self.default_average)
        h = _horizons(horizon)
        return np.full(h.shape, self.sigma2_value)

    def log_sigma_bar2(self, horizon, average: str | None = None) -> np.ndarray:
        return np.log(self.sigma_bar2(horizon, average))

    @property
    def satisfies_a3(self) -> bool:
        return True

    def to_dict(self) -> dict:
        return {"model": "constant", "sigma2": self.sigma2_value}


@dataclass(frozen=True, eq=False)
class TabulatedNoise:
    """Empirical sigma^2(s) from measured (staleness, squared noise) pairs (section 4).

    sigma^2 is linearly interpolated between the tabulated staleness values and held constant
    outside them. A measurement says nothing about staleness beyond the table, so by default
    (``extrapolate="none"``) every horizon search (``optimal_design``, ``optimal_config``)
    stops at ``max_horizon`` = ``measured_horizon`` = largest staleness + 1 (the horizon whose
    oldest sample has the largest measured staleness) and says so when the optimum sits there.
    ``extrapolate="hold_last"`` is the explicit opt-in to search longer horizons, taking
    sigma^2 beyond the table to equal its last measured value. A table that decreases
    somewhere is accepted; ``satisfies_a3`` is then False and results say so.

    Args:
        staleness: strictly increasing staleness values in steps, each >= 0; at least 1.
        sigma2: squared noise norms measured at those staleness values, each >= 0, not all 0.
        counts: optional number of samples behind each value (kept for reporting).
        extrapolate: one of ``EXTRAPOLATIONS``: "none" (horizon searches stay inside the
            measured range) or "hold_last" (beyond it, sigma^2 = the last measured value).
    """

    staleness: np.ndarray
    sigma2_values: np.ndarray
    counts: np.ndarray | None = None
    extrapolate: str = "none"
    default_average: str = field(default="discrete", init=False)

    def __post_init__(self):
        s = checks.finite_array("staleness", self.staleness, nonnegative_values=True)
        y = checks.finite_array("sigma2", self.sigma2_values, nonnegative_values=True)
        if s.shape != y.shape:
            raise ValueError(f"staleness and sigma2 must have the same length, got "
                             f"{s.shape[0]} and {y.shape[0]}")
        if np.any(np.diff(s) <= 0):
            raise ValueError("staleness must be strictly increasing (one value per staleness)")
        if not np.any(y > 0):
            raise ValueError("sigma2 must hold at least one value > 0 (all zero: no noise)")
        object.__setattr__(self, "staleness", s)
        object.__setattr__(self, "sigma2_values", y)
        checks.choice("extrapolate", self.extrapolate, EXTRAPOLATIONS)
        if self.counts is not None:
            c = checks.finite_array("counts", self.counts, nonnegative_values=True)
            if c.shape != s.shape:
                raise ValueError("counts must have the same length as staleness")
            object.__setattr__(self, "counts", c)
        # Integer staleness grid 0..s_max+1 and its cumulative sum for the discrete average,
        # knots (with 0) and cumulative integral for the continuous one.
        top = int(np.ceil(s[-1])) + 1
        grid = self.sigma2(np.arange(top + 1, dtype=float))
        object.__setattr__(self, "_top", top)
        object.__setattr__(self, "_csum", np.concatenate([[0.0], np.cumsum(grid)]))
        knots = np.concatenate([[0.0], s]) if s[0] > 0 else s
        vals = self.sigma2(knots)
        cint = np.concatenate([[0.0], np.cumsum(np.diff(knots) * (vals[1:] + vals[:-1]) / 2)])
        object.__setattr__(self, "_knots", knots)
        object.__setattr__(self, "_knot_vals", vals)
        object.__setattr__(self, "_cint", cint)

    @property
    def measured_horizon(self) -> float:
        """Longest horizon (steps) the table covers: largest measured staleness + 1."""
        return float(self.staleness[-1]) + 1.0

    @property
    def max_horizon(self) -> float:
        """Longest horizon (steps) a design may use: ``measured_horizon``, or inf when the
        table is extrapolated (``extrapolate="hold_last"``)."""
        return self.measured_horizon if self.extrapolate == "none" else float("inf")

    def sigma2(self, s) -> np.ndarray:
        return np.interp(np.asarray(s, dtype=float), self.staleness, self.sigma2_values)

    def _partial_sum(self, n: np.ndarray) -> np.ndarray:
        n = np.asarray(n, dtype=float)
        inside = np.minimum(n, self._top).astype(np.int64)
        return self._csum[inside] + np.maximum(n - self._top, 0.0) * self.sigma2_values[-1]

    def _integral(self, h: np.ndarray) -> np.ndarray:
        k = self._knots
        hc = np.minimum(h, k[-1])
        idx = np.clip(np.searchsorted(k, hc, side="right") - 1, 0, len(k) - 1)
        seg = hc - k[idx]
        left = self._knot_vals[idx]
        right_val = self.sigma2(hc)
        inside = self._cint[idx] + seg * (left + right_val) / 2
        return inside + np.maximum(h - k[-1], 0.0) * self.sigma2_values[-1]

    def sigma_bar2(self, horizon, average: str | None = None) -> np.ndarray:
        average = _check_average(average, self.default_average)
        h = _horizons(horizon)
        if average == "continuous":
            return self._integral(h) / h
        return _step_average(h, self._partial_sum, self.sigma2)

    def log_sigma_bar2(self, horizon, average: str | None = None) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.log(self.sigma_bar2(horizon, average))

    @property
    def satisfies_a3(self) -> bool:
        return bool(np.all(np.diff(self.sigma2_values) >= 0))

    @property
    def largest_drop(self) -> float:
        """Largest relative fall of sigma^2 between consecutive staleness values (0 if none)."""
        y = self.sigma2_values
        running_max = np.maximum.accumulate(y)
        with np.errstate(invalid="ignore", divide="ignore"):
            drops = np.where(running_max > 0, 1.0 - y / running_max, 0.0)
        return float(np.max(drops))

    def monotone_envelope(self) -> "TabulatedNoise":
        """The smallest non-decreasing table above this one (its running maximum).

        It satisfies A3 and still bounds the measured noise, so the theorem applies to it.
        """
        return TabulatedNoise(self.staleness, np.maximum.accumulate(self.sigma2_values),
                              self.counts, self.extrapolate)

    def to_dict(self) -> dict:
        d = {"model": "tabulated", "staleness": self.staleness.tolist(),
             "sigma2": self.sigma2_values.tolist(), "satisfies_a3": self.satisfies_a3}
        if self.counts is not None:
            d["counts"] = self.counts.tolist()
        if self.extrapolate != "none":  # absent means "none": saved tables stay unchanged
            d["extrapolate"] = self.extrapolate
        return d


def noise_from_dict(d: dict) -> NoiseModel:
    """Rebuild a noise model from ``to_dict`` output."""
    kind = d.get("model")
    if kind == "power_law":
        return PowerLawNoise(alpha=d["alpha"], tau=d.get("tau", 1.0))
    if kind == "constant":
        return ConstantNoise(d.get("sigma2", 1.0))
    if kind == "tabulated":
        return TabulatedNoise(d["staleness"], d["sigma2"], d.get("counts"),
                              d.get("extrapolate", "none"))
    raise ValueError(f"model must be one of ['constant', 'power_law', 'tabulated'], got {kind!r}")
