"""Reuse-aware variants of the design objective (theory.md section 10).

Section 5's J(x, y) counts every draw of a buffer sample as a fresh noise draw. Two measured
effects break that (section 8.6-8.8), and each variant adds one term that vanishes when its
constant is zero:

* **self-correlated reuse** (10.1-10.3): one rollout's noise at two uses g steps apart has
  correlation c(g). The noise that the Theorem charges is then the long-run variance of the
  batch noise, and

      J_c(x, y) = sigma_bar^2(x) (1 + y/mu) (1/y + 1/x + rho + S(x)),
      S(x) = (2/x) sum_{g >= 1} (1 - g/x)_+ c(g)   (``ReuseCorrelation.pair_sum``),

  so y*(x) = sqrt(mu / (rho + 1/x + S(x))); constant c gives S = c (1 - 1/x) and a closed
  form (``power_law_reuse_optimum``).
* **clipping-aware contribution** (10.4-10.5): a sample with u earlier uses and staleness s
  keeps a fraction f(u, s) = exp(-a u - b s) of its gradient; with Poisson use counts the
  buffer keeps on average f_bar(x, y) of the signal, and

      J_f(x, y) = sigma_bar^2(x) / f_bar(x, y)^2 (1 + y/mu) (1/y + 1/x + rho [+ S(x)]),

  minimised numerically over (x, y).

``VARIANTS`` names them: "self_correlated" (c only), "clipping" (f only) and "reuse_clipping"
(both). ``objective`` mirrors ``design.objective``; ``optimal_design`` runs section 5's
search (``design.search_design``) on a ``ReuseObjective`` and returns its ``design.Design``;
``calculator.optimal_config`` takes the terms (``reuse=``, ``contribution=``) to give
integers and a GPU split; ``calibrate.Calibration.design(mu, variant=...)`` uses the fitted
constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import checks
from .design import (METHODS, STANDARD, Design, Section5Objective, _check_noise,
                     _log_sigma_bar2, power_law_optimum, search_design)
from .noise import AVERAGES, PowerLawNoise

VARIANTS = ("self_correlated", "clipping", "reuse_clipping")


# ---- the self-correlation of one rollout's uses (section 10.1-10.3) ----------------------

@dataclass(frozen=True)
class ConstantReuse:
    """c(g) = c for every gap g >= 1 step (section 10.2).

    Args: c: correlation of one rollout's noise at two different steps, in [0, 1].
    """

    c: float

    def __post_init__(self):
        checks.unit_interval("c", self.c)

    def corr(self, gap) -> np.ndarray:
        """c(g) at gaps g >= 1 (steps), elementwise."""
        return np.full(np.shape(gap), float(self.c))

    def pair_sum(self, horizon, average: str = "discrete") -> np.ndarray:
        """S(x) (section 10.2): "discrete" the exact sum (2c/x)(n - n(n+1)/(2x)) with n the
        number of gaps g < x; "continuous" its smooth form c (1 - 1/x)_+ (exact at integer x).
        """
        checks.choice("average", average, AVERAGES)
        x = np.asarray(horizon, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            if average == "continuous":
                return self.c * np.maximum(1.0 - 1.0 / x, 0.0)
            n = np.maximum(np.ceil(x) - 1.0, 0.0)
            out = 2.0 * self.c / x * (n - n * (n + 1) / (2 * x))
        return np.where(np.isinf(x), self.c, out)

    def to_dict(self) -> dict:
        return {"model": "constant", "c": self.c}


@dataclass(frozen=True)
class TabulatedReuse:
    """c(g) measured at some gaps: linear interpolation, held constant outside (section 10.2).

    Args: gaps: increasing gaps >= 1 (steps). corr: c at those gaps, each in [0, 1].
    """

    gaps: tuple
    corr_values: tuple

    def __post_init__(self):
        g = checks.finite_array("gaps", self.gaps)
        c = checks.finite_array("corr_values", self.corr_values)
        if g.shape != c.shape:
            raise ValueError(f"gaps and corr_values must have the same length, got {g.size} "
                             f"and {c.size}")
        if np.any(g < 1) or np.any(np.diff(g) <= 0):
            raise ValueError("gaps must be increasing and >= 1")
        if np.any((c < 0) | (c > 1)):
            raise ValueError("corr_values must be in [0, 1]")

    def corr(self, gap) -> np.ndarray:
        """c(g), elementwise."""
        return np.interp(np.asarray(gap, dtype=float), self.gaps, self.corr_values)

    def pair_sum(self, horizon, average: str = "discrete") -> np.ndarray:
        """S(x) (section 10.2). "discrete": (2/x) sum over integer g < x of (1 - g/x) c(g),
        summed term by term up to the last measured gap and in closed form beyond (c is
        constant there). "continuous": the trapezoid form (2/x) int_0^x (1 - g/x) c(g) dg -
        c(0)/x, exact per segment by Simpson's rule (the integrand is quadratic there), which
        is c (1 - 1/x) for constant c."""
        checks.choice("average", average, AVERAGES)
        x = np.asarray(horizon, dtype=float)
        last = float(self.corr_values[-1])
        g_end = int(math.ceil(self.gaps[-1]))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if average == "discrete":
                g = np.arange(1, g_end + 1, dtype=float)
                c = self.corr(g)
                xe = x[..., None]
                head = np.sum(np.clip(1 - g / xe, 0, None) * c, axis=-1)
                n = np.maximum(np.ceil(x) - 1.0, 0.0)  # gaps 1..n have 1 - g/x > 0
                m = np.maximum(n - g_end, 0.0)  # tail gaps g_end + 1 .. n
                tail = last * (m - (m * g_end + m * (m + 1) / 2) / x)
                out = 2.0 / x * (head + tail)
            else:
                out = 2.0 / x * self._integral(x) - float(self.corr(0.0)) / x
        return np.where(np.isinf(x), last, np.maximum(out, 0.0))

    def _integral(self, x: np.ndarray) -> np.ndarray:
        """int_0^x (1 - g/x) c(g) dg, c piecewise linear (knots at 0 and the gaps)."""
        knots = np.concatenate([[0.0], np.asarray(self.gaps, dtype=float)])
        total = np.zeros(x.shape)
        edges = list(zip(knots[:-1], knots[1:])) + [(knots[-1], np.inf)]
        for lo, hi in edges:
            a, b = np.minimum(lo, x), np.minimum(hi, x)
            mid = (a + b) / 2

            def f(g):
                return (1 - g / x) * self.corr(g)
            total = total + (b - a) / 6 * (f(a) + 4 * f(mid) + f(b))
        return total

    def to_dict(self) -> dict:
        return {"model": "tabulated", "gaps": list(self.gaps),
                "corr_values": list(self.corr_values)}


# ---- the contribution a clipped sample keeps (section 10.4-10.5) -------------------------

@dataclass(frozen=True)
class ExpContribution:
    """f(u, s) = exp(-per_use u - per_step s): the share of its gradient a sample with u
    earlier uses and staleness s steps keeps under the clip (section 10.4).

    Args: per_use: a >= 0 (per earlier use). per_step: b >= 0 (per step of staleness).
    """

    per_use: float
    per_step: float

    def __post_init__(self):
        checks.nonnegative("per_use", self.per_use)
        checks.nonnegative("per_step", self.per_step)

    @property
    def is_null(self) -> bool:
        return self.per_use == 0 and self.per_step == 0

    def value(self, uses, staleness) -> np.ndarray:
        """f(u, s), elementwise."""
        return np.exp(-self.per_use * np.asarray(uses, float)
                      - self.per_step * np.asarray(staleness, float))

    def mean(self, horizon, replay_ratio, average: str = "discrete") -> np.ndarray:
        """f_bar(x, y) = average over the buffer of E_u f(u, s), u ~ Poisson(s y/x) (10.4):
        with k = b + (y/x)(1 - e^{-a}) per step, "continuous" (1 - e^{-kx})/(kx), "discrete"
        the average of the step function s -> e^{-k floor(s)} over [0, x]. Exactly 1 when
        a = b = 0."""
        checks.choice("average", average, AVERAGES)
        x, y = np.broadcast_arrays(np.asarray(horizon, float), np.asarray(replay_ratio, float))
        if self.is_null:
            return np.ones(x.shape)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            k = self.per_step - y / x * math.expm1(-self.per_use)
            if average == "continuous":
                kx = k * x
                out = -np.expm1(-kx) / kx
            else:
                n = np.floor(x)
                head = np.where(k > 0, np.expm1(-k * n) / np.expm1(-k), n)
                out = (head + (x - n) * np.exp(-k * n)) / x
            out = np.where(k * x < 1e-12, 1.0, out)
            return np.where(np.isinf(x), np.where(k > 0, 0.0, 1.0), out)

    def to_dict(self) -> dict:
        return {"model": "exponential", "per_use": self.per_use, "per_step": self.per_step}


def _check_reuse(reuse):
    if reuse is not None and not isinstance(reuse, (ConstantReuse, TabulatedReuse)):
        raise ValueError(f"reuse must be None, a ConstantReuse or a TabulatedReuse, got "
                         f"{type(reuse).__name__}")
    return reuse


def _check_contribution(contribution):
    if contribution is not None and not isinstance(contribution, ExpContribution):
        raise ValueError(f"contribution must be None or an ExpContribution, got "
                         f"{type(contribution).__name__}")
    return contribution


def _pair_sum(reuse, x, average):
    return 0.0 if reuse is None else reuse.pair_sum(x, average)


def objective(horizon, replay_ratio, *, mu: float, rho: float, noise, reuse=None,
              contribution=None, average: str | None = None) -> np.ndarray:
    """J(x, y) = sigma_bar^2(x) / f_bar(x, y)^2 (1 + y/mu) (1/y + 1/x + rho + S(x))
    (theory.md sections 10.3 and 10.5); ``reuse=None, contribution=None`` is section 5's J.

    Args:
        horizon: x = N/R > 0 (steps). replay_ratio: y = B/R > 0. mu > 0. rho in [0, 1].
        noise: staleness-noise model. reuse: ``ConstantReuse``/``TabulatedReuse`` or None.
        contribution: ``ExpContribution`` or None. average: "discrete"/"continuous" (the noise
        model's default if None), used for sigma_bar^2, S and f_bar alike.
    Returns: J in units of sigma^2 (arrays broadcast).
    """
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    _check_noise(noise)
    _check_reuse(reuse)
    _check_contribution(contribution)
    avg = noise.default_average if average is None else checks.choice("average", average, AVERAGES)
    x = np.asarray(horizon, dtype=float)
    y = np.asarray(replay_ratio, dtype=float)
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("replay_ratio must be finite and in (0, inf)")
    sb2 = noise.sigma_bar2(x, avg)
    if contribution is not None:
        sb2 = sb2 / contribution.mean(x, y, avg) ** 2
    return sb2 * (1 + y / mu) * (1 / y + 1 / x + rho + _pair_sum(reuse, x, avg))


def optimal_replay_ratio(horizon, *, mu: float, rho: float, reuse=None,
                         average: str = "discrete") -> np.ndarray:
    """y*(x) = sqrt(mu / (rho + 1/x + S(x))) without a contribution term (section 10.3)."""
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    x = np.asarray(horizon, dtype=float)
    with np.errstate(divide="ignore"):
        return np.sqrt(mu / (rho + 1.0 / x + _pair_sum(_check_reuse(reuse), x, average)))


def power_law_reuse_optimum(mu: float, rho: float, alpha: float, c: float):
    """Closed-form (x*, y*) for the power law (continuous average) and constant c (10.3).

    With S = c (1 - 1/x), K(x) = x^alpha (1/sqrt(mu) + sqrt(rho + c + (1 - c)/x)); with
    x = (1 - c) x' it is (1 - c)^alpha times section 5.5's K at rho' = rho + c, so
    y* = mu (1 - 2 alpha) / (alpha + sqrt(alpha^2 + mu rho' (1 - 2 alpha))) and
    x* = (1 - c) y*^2 / (2 alpha (mu + y*)). The form holds where x* >= 1 (below, S = 0 and
    section 5 applies); c = 1 gives x* = 0. Returns (x*, y*) as floats.
    """
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    alpha = checks.nonnegative("alpha", alpha)
    c = checks.unit_interval("c", c)
    rho_c = rho + c
    if rho_c <= 1:
        x1, y = power_law_optimum(mu, rho_c, alpha)
    else:  # section 5.5's roots, for a coupling above 1
        if alpha >= 0.5:
            return 0.0, 0.0
        y = mu * (1 - 2 * alpha) / (alpha + math.sqrt(alpha**2 + mu * rho_c * (1 - 2 * alpha)))
        x1 = math.inf if alpha == 0 else y**2 / (2 * alpha * (mu + y))
    return float((1 - c) * x1) if math.isfinite(x1) else x1, float(y)


# ---- the design ---------------------------------------------------------------------------

def variant_name(reuse, contribution) -> str:
    """The ``VARIANTS`` name of a (reuse, contribution) pair ("standard" if both are None)."""
    if reuse is None:
        return STANDARD if contribution is None else "clipping"
    return "self_correlated" if contribution is None else "reuse_clipping"


@dataclass(frozen=True)
class ReuseObjective(Section5Objective):
    """Section 10's J(x, y) as ``design.search_design`` sees it: section 5's with the
    self-correlation term S(x) (``reuse``) and/or the contribution f_bar (``contribution``),
    each a model or None; checked by the caller."""

    reuse: ConstantReuse | TabulatedReuse | None = None
    contribution: ExpContribution | None = None

    closed_form_requirement = ("method='closed_form' needs a PowerLawNoise, "
                               "average='continuous', a ConstantReuse (or none) and no "
                               "contribution")

    @property
    def variant(self) -> str:
        return variant_name(self.reuse, self.contribution)

    @property
    def profiled(self) -> bool:
        """y*(x) is closed-form without a contribution term (section 10.3), not with one."""
        return self.contribution is None

    @property
    def _reuse_or_zero(self):
        return ConstantReuse(0.0) if self.reuse is None else self.reuse

    def value(self, x, y) -> np.ndarray:
        """J(x, y) of sections 10.3 and 10.5, vectorised."""
        return objective(x, y, mu=self.mu, rho=self.rho, noise=self.noise, reuse=self.reuse,
                         contribution=self.contribution, average=self.average)

    def log_profile(self, u) -> np.ndarray:
        """log of sigma_bar^2(x) (1/sqrt(mu) + sqrt(rho + 1/x + S(x)))^2 (10.3), x = e^u."""
        c = 1.0 / math.sqrt(self.mu)
        s = self._reuse_or_zero.pair_sum(np.exp(u), self.average)
        return (_log_sigma_bar2(self.noise, np.exp(u), self.average)
                + 2 * np.log(c + np.sqrt(self.rho + np.exp(-u) + s)))

    def closed_form(self) -> tuple[float, float] | None:
        """``power_law_reuse_optimum`` for a power law (continuous average), a constant c (or
        none) and no contribution; None otherwise."""
        c = 0.0 if self.reuse is None else getattr(self.reuse, "c", None)
        if (isinstance(self.noise, PowerLawNoise) and self.average == "continuous"
                and c is not None and self.contribution is None):
            return power_law_reuse_optimum(self.mu, self.rho, self.noise.alpha, c)
        return None

    def closed_form_holds(self, horizon: float) -> bool:
        """The closed form assumes S = c (1 - 1/x), true for x >= 1 only (section 10.3)."""
        return horizon >= 1

    def ratio_at(self, horizon: float) -> float:
        """y*(x) of section 10.3 (0 at x = 0), far horizons evaluated at 1e15 steps."""
        if horizon == 0.0:
            return 0.0
        return float(optimal_replay_ratio(min(horizon, 1e15), mu=self.mu, rho=self.rho,
                                          reuse=self._reuse_or_zero, average=self.average))

    def value_at(self, horizon: float, replay_ratio: float, on_policy_value: float) -> float:
        """J at the optimum; J(1, 1) at x or y = 0 (on-policy); far horizons at 1e15 steps."""
        xs = min(horizon, 1e15)
        if math.isinf(replay_ratio) and self.contribution is None:
            # rho + S(x) underflows to 0 (e.g. rho = 0 and a denormal c): J's infimum over y
            # is the profile sigma_bar^2(x) (1/sqrt(mu) + sqrt(rho + 1/x + S(x)))^2 (10.3).
            k = self.rho + 1 / xs + float(_pair_sum(self.reuse, xs, self.average))
            return float(self.noise.sigma_bar2(xs, self.average)) \
                * (1 / math.sqrt(self.mu) + math.sqrt(k)) ** 2
        if horizon > 0 and replay_ratio > 0:
            return float(self.value(xs, replay_ratio))
        return on_policy_value

    def terms_at(self, horizon: float, replay_ratio: float) -> tuple[float, float]:
        """(S(x*), f_bar(x*, y*)), far horizons at 1e15 steps; (0, 1) at x = 0."""
        xs = min(horizon, 1e15)
        pair = float(_pair_sum(self.reuse, xs, self.average)) if horizon > 0 else 0.0
        kept = (float(self.contribution.mean(xs, max(replay_ratio, 1e-12), self.average))
                if self.contribution is not None and horizon > 0 else 1.0)
        return pair, kept

    def term_dicts(self) -> tuple[dict | None, dict | None]:
        return (None if self.reuse is None else self.reuse.to_dict(),
                None if self.contribution is None else self.contribution.to_dict())


def optimal_design(mu: float, rho: float, noise, *, reuse=None, contribution=None,
                   average: str | None = None, method: str = "auto") -> Design:
    """Optimal (x*, y*) of the reuse-aware objective (theory.md sections 10.3 and 10.5).

    Args:
        mu: generation cost of a batch over an update, > 0. rho: coupling in [0, 1].
        noise: staleness-noise model (a table caps x at its measured horizon, section 4.6).
        reuse: ``ConstantReuse``/``TabulatedReuse`` or None. contribution: ``ExpContribution``
            or None. average: as in ``objective``.
        method: "auto" (closed form for a power law, continuous average, constant c and no
            contribution, when its x* >= 1; else numeric), "numeric" or "closed_form".
    Returns: ``design.Design`` with ``variant`` naming the terms. Without reuse and
    contribution it is section 5's optimum.
    """
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    _check_noise(noise)
    reuse, contribution = _check_reuse(reuse), _check_contribution(contribution)
    method = checks.choice("method", method, METHODS)
    avg = noise.default_average if average is None else checks.choice("average", average,
                                                                     AVERAGES)
    return search_design(ReuseObjective(mu=mu, rho=rho, noise=noise, average=avg, reuse=reuse,
                                        contribution=contribution), method)


__all__ = ["VARIANTS", "STANDARD", "ConstantReuse", "TabulatedReuse", "ExpContribution",
           "ReuseObjective", "objective", "optimal_replay_ratio", "power_law_reuse_optimum",
           "optimal_design", "variant_name"]
