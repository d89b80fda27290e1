"""The convergence bound of the Theorem (theory.md section 4).

    (1/T) sum_{t<T} ||grad F(theta_t)||^2
        <= 12 F(theta_0) / (eta T) + 8 eta (4 N^2 kappa^2 eta / R^2 + L) V,
    V = sigma_bar^2(N/R) (1/B + 1/N + rho/R),

valid when eta <= R / (2 sqrt(2) kappa N) and eta < 1/(2L) (the paper prints "L/2"; the proof
needs L eta < 1/2) and T > 1.

Convention for violated preconditions: ``convergence_bound`` raises ``BoundConditionError`` (a
``ValueError``) naming the condition, the value and the limit; ``step_size_limit`` tells the
largest admissible step size beforehand. Optimisers in ``design`` search inside that limit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from .. import checks
from .noise import NoiseModel, a3_notes


class BoundConditionError(ValueError):
    """A precondition of the Theorem is violated (step size too large, too few steps)."""


@dataclass(frozen=True)
class VarianceTerms:
    """V = sigma_bar^2(N/R) (1/B + 1/N + rho/R) and its parts (section 4).

    ``minibatch`` is sigma_bar^2/B, ``local`` sigma_bar^2/N (drawing the same element twice),
    ``coupling`` sigma_bar^2 rho/R (correlation through the parameter path).
    """

    sigma_bar2: float
    minibatch: float
    local: float
    coupling: float

    @property
    def total(self) -> float:
        return self.minibatch + self.local + self.coupling


def variance_terms(buffer_size, batch_size, rollouts_per_step, rho: float, noise: NoiseModel,
                   average: str | None = None) -> VarianceTerms:
    """V and its three parts for a buffer of N rollouts, batch B and R new rollouts per step.

    Args:
        buffer_size: N > 0 (rollouts). batch_size: B in (0, N]. rollouts_per_step: R in (0, N].
            Real values are accepted (averages of an asynchronous run).
        rho: coupling coefficient in [0, 1].
        noise: a staleness-noise model (``replaytheory.model.noise``).
        average: "discrete" or "continuous" average of sigma^2; the model's default if None.
    """
    n = checks.positive("buffer_size", buffer_size)
    b = checks.positive("batch_size", batch_size)
    r = checks.positive("rollouts_per_step", rollouts_per_step)
    if r > n:
        raise ValueError(f"rollouts_per_step must be <= buffer_size ({n:g}), got {r:g}")
    if b > n:
        raise ValueError(f"batch_size must be <= buffer_size ({n:g}): a batch is drawn from "
                         f"the buffer; got {b:g}")
    rho = checks.unit_interval("rho", rho)
    sb2 = float(noise.sigma_bar2(n / r, average))
    return VarianceTerms(sb2, sb2 / b, sb2 / n, sb2 * rho / r)


def step_size_limit(buffer_size, rollouts_per_step, smoothness: float, kappa: float) -> float:
    """Largest step size the Theorem admits: min(R / (2 sqrt2 kappa N), 1/(2L)) (section 4).

    The 1/(2L) end is strict (eta < 1/(2L)); the kappa end is inclusive. kappa = 0 removes
    the first condition.
    """
    n = checks.positive("buffer_size", buffer_size)
    r = checks.positive("rollouts_per_step", rollouts_per_step)
    big_l = checks.positive("smoothness", smoothness)
    kappa = checks.nonnegative("kappa", kappa)
    limit = 1.0 / (2.0 * big_l)
    if kappa > 0:
        limit = min(limit, r / (2.0 * math.sqrt(2.0) * kappa * n))
    return limit


@dataclass(frozen=True)
class BoundResult:
    """Value of the Theorem's right-hand side and each of its terms.

    ``value = descent + bias_driven + smoothness_driven`` with
    descent = 12 F0 / (eta T), bias_driven = 32 eta^2 N^2 kappa^2 V / R^2,
    smoothness_driven = 8 eta L V. ``variance`` holds V's parts. ``notes`` lists caveats
    (e.g. assumption A3 not holding for the noise model used).
    """

    value: float
    descent: float
    bias_driven: float
    smoothness_driven: float
    variance: VarianceTerms
    step_size_limit: float
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["variance"]["total"] = self.variance.total
        d["notes"] = list(self.notes)
        return d


def _bound_terms(n, r, eta, big_l, kappa, f0, steps, var_total):
    descent = 12.0 * f0 / (eta * steps)
    bias = 8.0 * eta * 4.0 * n**2 * kappa**2 * eta / r**2 * var_total
    smooth = 8.0 * eta * big_l * var_total
    return descent, bias, smooth


def convergence_bound(*, buffer_size, batch_size, rollouts_per_step, lr: float,
                      smoothness: float, kappa: float, f0: float, steps: float, rho: float,
                      noise: NoiseModel, average: str | None = None) -> BoundResult:
    """The Theorem's bound on the average squared gradient norm (theory.md section 4).

    Args:
        buffer_size: N > 0 rollouts; batch_size: B in (0, N]; rollouts_per_step: R in (0, N].
        lr: step size eta > 0, must satisfy eta <= R/(2 sqrt2 kappa N) and eta < 1/(2L).
        smoothness: L > 0 (A1). kappa: bias constant >= 0 (A2). f0: F(theta_0) >= 0.
        steps: number of updates T > 1 (real values allowed for budgets).
        rho: coupling in [0, 1]. noise: the staleness-noise model (A3).
        average: sigma_bar^2 average ("discrete"/"continuous"), model default if None.

    Raises:
        BoundConditionError: a step-size condition or T > 1 is violated.
        ValueError: any argument outside its range.
    """
    eta = checks.positive("lr", lr)
    big_l = checks.positive("smoothness", smoothness)
    kappa = checks.nonnegative("kappa", kappa)
    f0 = checks.nonnegative("f0", f0)
    steps = checks.positive("steps", steps)
    terms = variance_terms(buffer_size, batch_size, rollouts_per_step, rho, noise, average)
    n, r = float(buffer_size), float(rollouts_per_step)
    if steps <= 1:
        raise BoundConditionError(f"steps must be > 1 for the Theorem, got {steps:g}")
    if eta >= 1.0 / (2.0 * big_l):
        raise BoundConditionError(
            f"lr must be < 1/(2L) = {1 / (2 * big_l):.6g} (L = {big_l:g}), got {eta:g}")
    if kappa > 0 and eta > r / (2 * math.sqrt(2) * kappa * n):
        raise BoundConditionError(
            f"lr must be <= R/(2 sqrt2 kappa N) = {r / (2 * math.sqrt(2) * kappa * n):.6g} "
            f"(R = {r:g}, N = {n:g}, kappa = {kappa:g}), got {eta:g}")
    descent, bias, smooth = _bound_terms(n, r, eta, big_l, kappa, f0, steps, terms.total)
    return BoundResult(value=descent + bias + smooth, descent=descent, bias_driven=bias,
                       smoothness_driven=smooth, variance=terms,
                       step_size_limit=step_size_limit(n, r, big_l, kappa),
                       notes=tuple(a3_notes(noise)))


def bound_value(n, b, r, eta, big_l, kappa, f0, steps, rho, sigma_bar2) -> np.ndarray:
    """The bound's value, vectorised over arrays, with no checks (for optimisers).

    Arguments as in ``convergence_bound`` with ``sigma_bar2`` already evaluated at N/R.
    Points that violate a step-size condition are returned as +inf.
    """
    var_total = sigma_bar2 * (1.0 / b + 1.0 / n + rho / r)
    descent, bias, smooth = _bound_terms(n, r, eta, big_l, kappa, f0, steps, var_total)
    value = descent + bias + smooth
    bad = (eta >= 1.0 / (2.0 * big_l)) | (steps <= 1)
    if kappa > 0:
        bad = bad | (eta > r / (2 * math.sqrt(2) * kappa * n) * (1 + 1e-12))
    return np.where(bad, np.inf, value)
