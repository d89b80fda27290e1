"""Optimal buffer design at a fixed compute budget (theory.md section 5).

Asymptotic design (budget -> infinity, optimal step size -> 0, the kappa term vanishes):

    J(R, B, N) = (B + mu R) sigma_bar^2(N/R) (1/B + 1/N + rho/R)
    J(x, y)    = sigma_bar^2(x) (1 + y/mu) (1/y + 1/x + rho),   x = N/R, y = B/R,

so that J(R, B, N) = mu J(x, y): J is homogeneous of degree 0 in (R, B, N).
The compute needed to reach a given bound value is proportional to J: at the optimal step
size the bound is 2 sqrt(96 F0 L V / T), so T ~ V and compute ~ (cost per step) V ~ J.
Hence ``predicted_saving = 1 - J(x*, y*) / J(1, 1)`` against on-policy training (a buffer of
one step's rollouts, each used once: x = y = 1).

For fixed x the optimal y is y*(x) = sqrt(mu / (rho + 1/x)), and x* minimises the profile
sigma_bar^2(x) (1/sqrt(mu) + sqrt(rho + 1/x))^2. ``optimal_design`` does this for any noise
model numerically and, for the power law with the continuous average, also in closed form.

Finite step size: ``finite_lr_design`` minimises the Theorem's full bound (section 4), kappa
term included, at a fixed batch size and compute budget, over (x, y) and, if asked, eta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize

from . import checks
from .bound import BoundResult, bound_value, convergence_bound, step_size_limit
from .noise import NoiseModel, PowerLawNoise, a3_notes

ON_POLICY = "on-policy"
REPLAY = "replay"

# Search range of the horizon x (steps), in log space: wide enough for the on-policy corner
# of alpha just below 1/2 (x* ~ 1e-8) and for alpha near 0 (x* ~ 1e5 and beyond).
_LOG_X_LO, _LOG_X_HI = math.log(1e-30), math.log(1e15)
_LOG_X_GRID = np.linspace(_LOG_X_LO, _LOG_X_HI, 1801)


def _check_noise(noise) -> NoiseModel:
    if not isinstance(noise, NoiseModel):
        raise ValueError(f"noise must be a noise model (PowerLawNoise, ConstantNoise, "
                         f"TabulatedNoise, ...), got {type(noise).__name__}")
    return noise


def _log_sigma_bar2(noise, x, average):
    f = getattr(noise, "log_sigma_bar2", None)
    if f is not None:
        return f(x, average)
    with np.errstate(divide="ignore"):
        return np.log(noise.sigma_bar2(x, average))


def objective(horizon, replay_ratio, *, mu: float, rho: float, noise: NoiseModel,
              average: str | None = None) -> np.ndarray:
    """J(x, y) = sigma_bar^2(x) (1 + y/mu) (1/y + 1/x + rho) (theory.md section 5).

    Args:
        horizon: x = N/R > 0 in steps (array ok). replay_ratio: y = B/R > 0 (array ok).
        mu: generation cost of a batch over a trainer update, > 0. rho: coupling in [0, 1].
        noise: staleness-noise model. average: "discrete" or "continuous" (model default).
    Returns:
        J in units of sigma^2 (array broadcast over x and y). Compute to reach a target bound
        is proportional to J.
    """
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    _check_noise(noise)
    x = np.asarray(horizon, dtype=float)
    y = np.asarray(replay_ratio, dtype=float)
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("replay_ratio must be finite and in (0, inf)")
    return noise.sigma_bar2(x, average) * (1 + y / mu) * (1 / y + 1 / x + rho)


def objective_rbn(rollouts_per_step, batch_size, buffer_size, *, mu: float, rho: float,
                  noise: NoiseModel, average: str | None = None) -> np.ndarray:
    """J(R, B, N) = (B + mu R) sigma_bar^2(N/R) (1/B + 1/N + rho/R) (section 5).

    Equal to mu * J(x = N/R, y = B/R): homogeneous of degree 0 in (R, B, N).
    Args: R, B, N > 0 (arrays ok; N >= R expected), the rest as in ``objective``.
    """
    r = np.asarray(rollouts_per_step, dtype=float)
    b = np.asarray(batch_size, dtype=float)
    n = np.asarray(buffer_size, dtype=float)
    for name, a in (("rollouts_per_step", r), ("batch_size", b), ("buffer_size", n)):
        if np.any(~np.isfinite(a)) or np.any(a <= 0):
            raise ValueError(f"{name} must be finite and in (0, inf)")
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    return (b + mu * r) * _check_noise(noise).sigma_bar2(n / r, average) \
        * (1 / b + 1 / n + rho / r)


def optimal_replay_ratio(horizon, *, mu: float, rho: float) -> np.ndarray:
    """y*(x) = sqrt(mu / (rho + 1/x)), the best replay ratio at horizon x (section 5)."""
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    x = np.asarray(horizon, dtype=float)
    with np.errstate(divide="ignore"):
        return np.sqrt(mu / (rho + 1.0 / x))


def profile_objective(horizon, *, mu: float, rho: float, noise: NoiseModel,
                      average: str | None = None) -> np.ndarray:
    """min_y J(x, y) = sigma_bar^2(x) (1/sqrt(mu) + sqrt(rho + 1/x))^2 (section 5)."""
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    x = np.asarray(horizon, dtype=float)
    return _check_noise(noise).sigma_bar2(x, average) \
        * (1 / math.sqrt(mu) + np.sqrt(rho + 1 / x)) ** 2


def k_function(horizon, *, mu: float, rho: float, alpha: float) -> np.ndarray:
    """K(x) = x^alpha (1/sqrt(mu) + sqrt(rho + 1/x)); x* minimises it (section 5, power law)."""
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    alpha = checks.nonnegative("alpha", alpha)
    x = np.asarray(horizon, dtype=float)
    return x ** alpha * (1 / math.sqrt(mu) + np.sqrt(rho + 1 / x))


def power_law_optimum(mu, rho, alpha):
    """Closed-form (x*, y*) for sigma(s) = (s/tau)^alpha, continuous average (section 5).

    For alpha < 1/2, y* solves rho y^2 + 2 alpha y + mu (2 alpha - 1) = 0:
    y* = mu (1 - 2 alpha) / (alpha + sqrt(alpha^2 + mu rho (1 - 2 alpha))) (the same root,
    written so that rho -> 0 gives mu (1 - 2 alpha) / (2 alpha)), and
    x* = y*^2 / (2 alpha (mu + y*)). alpha >= 1/2: (0, 0), stay on-policy. alpha = 0:
    x* = inf and y* = sqrt(mu / rho) (inf if rho = 0).

    Vectorised: mu > 0, rho in [0, 1], alpha >= 0 broadcast together; returns (x*, y*).
    """
    mu, rho, alpha = np.broadcast_arrays(np.asarray(mu, float), np.asarray(rho, float),
                                         np.asarray(alpha, float))
    if np.any(~np.isfinite(mu)) or np.any(mu <= 0):
        raise ValueError("mu must be finite and in (0, inf)")
    if np.any(~np.isfinite(rho)) or np.any((rho < 0) | (rho > 1)):
        raise ValueError("rho must be in [0, 1]")
    if np.any(~np.isfinite(alpha)) or np.any(alpha < 0):
        raise ValueError("alpha must be finite and in [0, inf)")
    a = np.minimum(alpha, 0.5)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = mu * (1 - 2 * a) / (a + np.sqrt(a**2 + mu * rho * (1 - 2 * a)))
        x = y**2 / (2 * a * (mu + y))
    on_policy = alpha >= 0.5
    x = np.where(on_policy, 0.0, np.where(alpha == 0, np.inf, x))
    y = np.where(on_policy, 0.0, y)
    if x.ndim == 0:
        return float(x), float(y)
    return x, y


@dataclass(frozen=True)
class Design:
    """The continuous optimum of section 5 and what it implies.

    Attributes:
        horizon: x* = N/R in steps; below 1 signals the on-policy regime; 0 means the infimum
            is at x -> 0 (e.g. alpha >= 1/2); inf means "as long as allowed" (e.g. alpha = 0).
        replay_ratio: y* = B/R, average uses per rollout.
        objective: J(x*, y*); on_policy_objective: J(1, 1).
        j_ratio: J(x*, y*) / J(1, 1) in the replay regime, 1 in the on-policy regime (the
            recommendation is then on-policy training itself).
        predicted_saving: 1 - j_ratio, the predicted fraction of compute saved against
            on-policy training to reach the same bound (section 5).
        regime: "on-policy" (x* < 1) or "replay".
        method: "closed_form" or "numeric". average: sigma_bar^2 average used.
        notes: caveats (assumption A3 broken, degenerate model, unbounded optimum).
    """

    mu: float
    rho: float
    noise: dict
    average: str
    method: str
    horizon: float
    replay_ratio: float
    objective: float
    on_policy_objective: float
    j_ratio: float
    predicted_saving: float
    regime: str
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {k: (list(val) if isinstance(val, tuple) else val)
                for k, val in self.__dict__.items()}


def _numeric_optimum(mu, rho, noise, average, x_max=math.inf):
    """argmin over x <= x_max of the profile min_y J(x, y) (section 5)."""
    c = 1.0 / math.sqrt(mu)
    return _minimise_over_horizon(
        lambda u: _log_sigma_bar2(noise, np.exp(u), average)
        + 2 * np.log(c + np.sqrt(rho + np.exp(-u))), x_max)


def optimal_horizon(replay_ratio: float, *, mu: float, rho: float, noise: NoiseModel,
                    average: str | None = None, x_max: float = math.inf) -> float:
    """argmin over x of J(x, y) at a fixed replay ratio y (section 5).

    Used when y is set by something else, e.g. the worker/trainer split (y = mu T / W).
    Args: replay_ratio y > 0; mu > 0; rho in [0, 1]; noise model; x_max > 0 caps the search.
    Returns x in steps (0.0 if the infimum is at x -> 0, ``x_max`` if J keeps falling).
    """
    y = checks.positive("replay_ratio", replay_ratio)
    checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    avg = _check_noise(noise).default_average if average is None else average
    return _minimise_over_horizon(
        lambda u: _log_sigma_bar2(noise, np.exp(u), avg) + np.log(1 / y + rho + np.exp(-u)),
        x_max)


def _minimise_over_horizon(log_objective, x_max=math.inf):
    """argmin over x = e^u <= x_max of a log objective: log grid, Brent, first-order polish.

    Returns 0.0 when the infimum is at x -> 0 and ``x_max`` when the objective keeps falling.
    """
    def log_profile(u):
        val = log_objective(np.asarray(u, dtype=float))
        return np.where(np.isnan(val), np.inf, val)

    grid = _LOG_X_GRID
    if math.isfinite(x_max):
        grid = np.append(grid[grid < math.log(x_max)], math.log(x_max))
    vals = log_profile(grid)
    i = int(np.argmin(vals))
    if vals[i] == -np.inf:
        # sigma_bar^2 vanishes (power law, discrete average, H <= 1): J = 0 on a whole
        # interval; return its right end, the longest horizon with zero objective.
        return float(np.exp(grid[np.flatnonzero(vals == -np.inf)[-1]]))
    if not np.isfinite(vals[i]):
        raise ValueError("the noise model gives no finite objective at any horizon")
    # Ties within rounding at an end of the range mean the profile is flat there (e.g. the
    # noise stops growing): report the limit rather than an arbitrary far-out grid point.
    capped = math.isfinite(x_max) and i == grid.size - 1
    if capped:
        # The cap is the last grid point: the optimum lies between its neighbour and the cap
        # (the polish below keeps whichever is lower, the cap included).
        lo, hi = grid[i - 1], grid[i]
    elif vals[-1] - vals[i] <= 1e-12:
        return x_max
    elif i == 0 or vals[0] - vals[i] <= 1e-12:
        return 0.0
    else:
        lo, hi = grid[i - 1], grid[i + 1]
    res = optimize.minimize_scalar(lambda u: float(log_profile(u)), bounds=(lo, hi),
                                   method="bounded", options={"xatol": 1e-12})
    best = float(res.x)
    h = 1e-6

    def slope(u):
        return float(log_profile(u + h) - log_profile(u - h)) / (2 * h)

    if capped and log_profile(hi) <= log_profile(best):
        best = hi
    try:
        if slope(lo) < 0 < slope(hi):
            root = optimize.brentq(slope, lo, hi, xtol=1e-14, rtol=1e-15)
            if log_profile(root) <= log_profile(best) + 1e-13:
                best = root
    except (ValueError, RuntimeError):
        pass
    return float(x_max) if capped and best == hi else float(math.exp(best))


def optimal_design(mu: float, rho: float, noise: NoiseModel, *, average: str | None = None,
                   method: str = "auto") -> Design:
    """Optimal staleness horizon x* and replay ratio y* at a fixed budget (section 5).

    Args:
        mu: generation cost of one batch over one trainer update, in (0, inf).
        rho: coupling coefficient, in [0, 1].
        noise: staleness-noise model (``PowerLawNoise``, ``ConstantNoise``, ``TabulatedNoise``
            or any object following ``noise.NoiseModel``).
        average: "continuous" or "discrete" sigma_bar^2; default: the model's own
            (continuous for the power law, as in section 5; discrete for tabulated models).
        method: "auto" (closed form for the power law with the continuous average, else
            numeric), "numeric" (any model) or "closed_form" (power law only).

    Returns:
        ``Design``. x* below 1 step is a valid answer: the on-policy regime.
        ``optimal_config`` turns it into integers and a GPU split.
    """
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    _check_noise(noise)
    method = checks.choice("method", method, ("auto", "numeric", "closed_form"))
    avg = noise.default_average if average is None else checks.choice(
        "average", average, ("discrete", "continuous"))
    closed_ok = isinstance(noise, PowerLawNoise) and avg == "continuous"
    if method == "closed_form" and not closed_ok:
        raise ValueError("method='closed_form' needs a PowerLawNoise with average='continuous'")
    if method == "auto":
        method = "closed_form" if closed_ok else "numeric"
    notes = list(a3_notes(noise))
    x, y = _optimum(mu, rho, noise, avg, method, notes)
    return _design_at(x, y, mu=mu, rho=rho, noise=noise, average=avg, method=method,
                      notes=notes)


def _measured_edge_note(x_max: float) -> str:
    """The caveat of an optimum at a measured noise table's longest horizon ``x_max`` (steps;
    theory.md section 4.6): a lower bound, not an optimum."""
    return (f"the optimum sits at the longest measured horizon ({x_max:g} steps): the table "
            "cannot tell whether a longer horizon is better; measure longer staleness or use "
            "a parametric model")


def _optimum(mu, rho, noise, avg, method, notes):
    """(x*, y*) by the closed form or numerically (section 5); appends caveats to notes."""
    if method == "closed_form":
        x, y = power_law_optimum(mu, rho, noise.alpha)
    else:
        x_max = float(getattr(noise, "max_horizon", math.inf))
        x = _numeric_optimum(mu, rho, noise, avg, x_max)
        if math.isfinite(x_max) and x >= x_max:
            notes.append(_measured_edge_note(x_max))
        if x == 0.0:
            y = 0.0
        elif math.isinf(x):
            y = math.sqrt(mu / rho) if rho > 0 else math.inf
        else:
            y = float(optimal_replay_ratio(x, mu=mu, rho=rho))
    if math.isinf(x):
        notes.append("the objective keeps falling as the horizon grows (noise does not grow "
                     "with staleness): the best buffer is as large as other limits allow")
    if isinstance(noise, PowerLawNoise) and noise.alpha >= 0.5:
        notes.append("alpha >= 1/2: staleness noise grows too fast for any buffer to pay off")
    return x, y


def _design_at(x, y, *, mu, rho, noise, average, method, notes) -> Design:
    """The ``Design`` record of the optimum (x, y): J there against on-policy's J(1, 1)."""
    j_on = float(objective(1.0, 1.0, mu=mu, rho=rho, noise=noise, average=average))
    if x == 0.0:
        j_star = float(np.exp(np.min(_log_profile_limit(mu, rho, noise, average))))
    elif math.isinf(x) or math.isinf(y):
        j_star = float(np.exp(_log_sigma_bar2(noise, 1e15, average))
                       * (1 / math.sqrt(mu) + math.sqrt(rho)) ** 2)
    else:
        j_star = float(objective(x, y, mu=mu, rho=rho, noise=noise, average=average))
    if j_star == 0.0:
        notes.append("the objective vanishes at short horizons (sigma(0) = 0 with the discrete "
                     "average): the design is degenerate; use the continuous average or a "
                     "model with sigma(0) > 0")
    regime = ON_POLICY if x < 1.0 else REPLAY
    if regime == ON_POLICY:
        j_ratio = 1.0
    elif j_on > 0:
        j_ratio = j_star / j_on
    else:
        j_ratio = math.nan
        notes.append("sigma_bar^2(1) = 0 under this model and average (sigma(0) = 0): the "
                     "on-policy reference J(1, 1) vanishes and the ratio is undefined")
    return Design(mu=mu, rho=rho, noise=noise.to_dict(), average=average, method=method,
                  horizon=float(x), replay_ratio=float(y), objective=j_star,
                  on_policy_objective=j_on, j_ratio=j_ratio, predicted_saving=1.0 - j_ratio,
                  regime=regime, notes=tuple(notes))


def _log_profile_limit(mu, rho, noise, average):
    """log of the profile objective at the smallest grid horizon (the x -> 0 limit)."""
    x = np.exp(_LOG_X_GRID[:3])
    return _log_sigma_bar2(noise, x, average) + 2 * np.log(1 / math.sqrt(mu)
                                                           + np.sqrt(rho + 1 / x))


# --------------------------------------------------------------------------------------------
# Finite step size: the Theorem's full bound at a fixed budget.


@dataclass(frozen=True)
class FiniteLRDesign:
    """Minimiser of the Theorem's bound at a fixed batch size and compute budget (section 4).

    Attributes:
        horizon, replay_ratio: x = N/R and y = B/R at the optimum.
        lr: the step size used (given, or optimised inside the admissible range).
        batch_size: B; rollouts_per_step: R = B/y; buffer_size: N = xR (real numbers).
        steps: updates affordable with the budget, budget / (1 + mu/y).
        bound: the Theorem's bound and its terms at the optimum.
        on_policy_bound: the bound at x = y = 1 with the same lr rule (given or optimised).
        bound_ratio: bound / on_policy_bound.
        asymptotic: the section-5 design for the same (mu, rho, noise), for comparison.
        notes: caveats.
    """

    horizon: float
    replay_ratio: float
    lr: float
    batch_size: int
    rollouts_per_step: float
    buffer_size: float
    steps: float
    bound: BoundResult
    on_policy_bound: float
    bound_ratio: float
    asymptotic: Design
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = {k: val for k, val in self.__dict__.items()
             if k not in ("bound", "asymptotic", "notes")}
        d["bound"] = self.bound.to_dict()
        d["asymptotic"] = self.asymptotic.to_dict()
        d["notes"] = list(self.notes)
        return d


def _best_lr(descent_coef, lin_coef, quad_coef, limit):
    """argmin over eta in (0, limit] of a/eta + b eta + c eta^2 (a, b, c >= 0), vectorised.

    The stationary point solves 2c eta^3 + b eta^2 - a = 0 (one positive root); the bound is
    convex in eta > 0, so clipping the root to the admissible range gives the minimiser.
    """
    a, b, c = np.broadcast_arrays(descent_coef, lin_coef, quad_coef)
    eta = np.empty(a.shape)
    flat = np.nditer([a, b, c, eta], op_flags=[["readonly"]] * 3 + [["writeonly"]])
    for ai, bi, ci, out in flat:
        if ci > 0:
            roots = np.roots([2 * ci, bi, 0.0, -ai])
            real = roots[(np.abs(roots.imag) < 1e-9 * np.abs(roots).max()) & (roots.real > 0)]
            out[...] = real.real.min()
        elif bi > 0:
            out[...] = math.sqrt(ai / bi)
        else:
            out[...] = np.inf
    return np.minimum(eta, limit)


def _finite_bound(x, y, mu, rho, noise, avg, b, big_l, kappa, f0, budget, lr):
    """(bound, eta) at (x, y) for batch b and the budget; eta optimal if lr is None."""
    x, y = np.broadcast_arrays(np.asarray(x, float), np.asarray(y, float))
    r = b / y
    n = x * r
    steps = budget / (1 + mu / y)
    sb2 = noise.sigma_bar2(x, avg)
    var = sb2 * (1 / b + 1 / n + rho / r)
    limit = np.full(x.shape, (1 - 1e-9) / (2 * big_l))
    if kappa > 0:
        limit = np.minimum(limit, 1 / (2 * math.sqrt(2) * kappa * x))
    if lr is None:
        eta = _best_lr(12 * f0 / steps, 8 * big_l * var, 32 * x**2 * kappa**2 * var, limit)
    else:
        eta = np.full(x.shape, lr)
    val = bound_value(n, b, r, eta, big_l, kappa, f0, steps, rho, sb2)
    return np.where(y <= x, val, np.inf), eta  # N >= B: a batch is drawn from the buffer


def finite_lr_objective(horizon, replay_ratio, *, mu: float, rho: float, noise: NoiseModel,
                        batch_size: int, smoothness: float, kappa: float, f0: float,
                        budget: float, lr: float | None = None,
                        average: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The Theorem's bound at (x, y) for a fixed batch and budget (section 4), vectorised.

    What ``finite_lr_design`` minimises: R = B/y, N = xR, budget / (1 + mu/y) updates, and
    the step size optimal for each point inside the admissible range (or ``lr`` if given).
    Points with y > x (N < B) or an inadmissible step size are +inf.

    Args: as ``finite_lr_design``; horizon and replay_ratio broadcast (each > 0).
    Returns: (bound values, step sizes used).
    """
    args = _finite_args(mu, rho, noise, batch_size, smoothness, kappa, f0, budget, lr, average)
    return _finite_bound(horizon, replay_ratio, *args)


def _finite_args(mu, rho, noise, batch_size, smoothness, kappa, f0, budget, lr, average):
    """Checked arguments of the finite-step-size bound, in ``_finite_bound``'s order."""
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    _check_noise(noise)
    b = checks.integer("batch_size", batch_size, 1)
    big_l = checks.positive("smoothness", smoothness)
    kappa = checks.nonnegative("kappa", kappa)
    f0 = checks.nonnegative("f0", f0)
    budget = checks.positive("budget", budget)
    if lr is not None:
        lr = checks.positive("lr", lr)
        if lr >= 1 / (2 * big_l):
            raise ValueError(f"lr must be < 1/(2L) = {1 / (2 * big_l):.6g}, got {lr:g}")
    avg = noise.default_average if average is None else average
    return mu, rho, noise, avg, b, big_l, kappa, f0, budget, lr


@dataclass(frozen=True)
class _SearchBox:
    """Search box of ``finite_lr_design`` (theory.md section 5.8): horizon x in [x_lo, x_hi]
    (steps) and replay ratio y in [y_lo, y_hi], all > 0 with lo < hi."""

    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float


@dataclass(frozen=True)
class _BoxOptimum:
    """The minimiser of the finite-step bound in a ``_SearchBox``: x = N/R (steps), y = B/R."""

    horizon: float
    replay_ratio: float


def _check_search_box(horizon_range, replay_range) -> _SearchBox:
    """Validate ``finite_lr_design``'s (lo, hi) ranges: positive, lo < hi."""
    x_lo, x_hi = (checks.positive("horizon_range[0]", horizon_range[0]),
                  checks.positive("horizon_range[1]", horizon_range[1]))
    y_lo, y_hi = (checks.positive("replay_range[0]", replay_range[0]),
                  checks.positive("replay_range[1]", replay_range[1]))
    if x_lo >= x_hi or y_lo >= y_hi:
        raise ValueError("horizon_range and replay_range must be (lo, hi) with lo < hi")
    return _SearchBox(x_lo=x_lo, x_hi=x_hi, y_lo=y_lo, y_hi=y_hi)


def _minimise_in_box(evaluate, box: _SearchBox) -> _BoxOptimum:
    """Minimise ``evaluate(x, y)[0]`` (the bound of theory.md section 5.8) over ``box``: an
    81 x 81 log grid, polished by Nelder-Mead in log space and kept only if it improves.

    Raises ValueError when no grid point is admissible (finite bound).
    """
    ux = np.linspace(math.log(box.x_lo), math.log(box.x_hi), 81)
    uy = np.linspace(math.log(box.y_lo), math.log(box.y_hi), 81)
    gx, gy = np.meshgrid(np.exp(ux), np.exp(uy), indexing="ij")
    vals, _ = evaluate(gx, gy)
    if not np.any(np.isfinite(vals)):
        raise ValueError("no admissible (horizon, replay_ratio) in the search box: the step "
                         "size is too large for every horizon, or the budget allows <= 1 step")
    i, j = np.unravel_index(int(np.nanargmin(np.where(np.isfinite(vals), vals, np.nan))),
                            vals.shape)

    def obj(p):
        u = np.clip(p, [ux[0], uy[0]], [ux[-1], uy[-1]])
        val = float(evaluate(math.exp(u[0]), math.exp(u[1]))[0])
        return math.log(val) if np.isfinite(val) and val > 0 else 1e300

    res = optimize.minimize(obj, [ux[i], uy[j]], method="Nelder-Mead",
                            options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 4000})
    u = np.clip(res.x, [ux[0], uy[0]], [ux[-1], uy[-1]])
    if obj(u) > obj([ux[i], uy[j]]):
        u = np.array([ux[i], uy[j]])
    return _BoxOptimum(horizon=float(math.exp(u[0])), replay_ratio=float(math.exp(u[1])))


def _finite_notes(noise, opt: _BoxOptimum, box: _SearchBox, *, lr, eta: float, r: float,
                  big_l: float, kappa: float, x_measured: float = math.inf) -> list[str]:
    """Caveats of a finite-step design: A3 (``a3_notes``), an optimum on the edge of the
    search box or at the longest measured horizon ``x_measured``, an optimised step size eta
    on the theorem's limit (theory.md section 4.4)."""
    x, y = opt.horizon, opt.replay_ratio
    notes = list(a3_notes(noise))
    # The box's x edge is the table's, not a search choice: say that, not "widen it".
    at_table_edge = box.x_hi == x_measured and x >= x_measured * (1 - 1e-6)
    if at_table_edge:
        notes.append(_measured_edge_note(x_measured))
    for name, val, lo_, hi_ in (("horizon", x, box.x_lo, box.x_hi),
                                ("replay_ratio", y, box.y_lo, box.y_hi)):
        if name == "horizon" and at_table_edge:
            continue
        if val <= lo_ * (1 + 1e-6) or val >= hi_ * (1 - 1e-6):
            notes.append(f"{name} optimum lies on the edge of its search range "
                         f"[{lo_:g}, {hi_:g}]: widen it")
    if lr is None and eta >= step_size_limit(x * r, r, big_l, kappa) * (1 - 1e-6):
        notes.append("the best step size sits on the Theorem's admissible limit")
    return notes


def finite_lr_design(mu: float, rho: float, noise: NoiseModel, *, batch_size: int,
                     smoothness: float, kappa: float, f0: float, budget: float,
                     lr: float | None = None, average: str | None = None,
                     horizon_range=(1.0, 1e5), replay_range=(1e-2, 1e4)) -> FiniteLRDesign:
    """Minimise the Theorem's full bound over (x, y) (and eta if ``lr`` is None), section 4.

    The asymptotic design drops the bias (kappa) term; at a fixed step size and budget it
    stays. Here the batch size B is held fixed (the user's batch), R = B/y and N = xR with
    N >= B (y <= x), and the number of updates is ``budget / (1 + mu/y)`` (budget in
    trainer-update units). The search is described in theory.md section 5.8.

    Args:
        mu: generation cost of one batch over one update, > 0. rho: coupling in [0, 1].
        noise: staleness-noise model (its scale matters here, unlike in ``optimal_design``).
        batch_size: B, integer >= 1. smoothness: L > 0. kappa: bias constant >= 0.
        f0: F(theta_0) >= 0. budget: total compute in trainer updates, > 0.
        lr: fixed step size > 0 (admissible points only: x <= 1/(2 sqrt2 kappa eta), and
            eta < 1/(2L) required), or None to optimise it for each (x, y).
        average: sigma_bar^2 average (model default if None).
        horizon_range, replay_range: search boxes for x and y (positive, lo < hi); x starts
            at 1 by default (a buffer smaller than one step of rollouts discards rollouts).
    Raises:
        BoundConditionError / ValueError: bad arguments, or no admissible point.
    """
    args = _finite_args(mu, rho, noise, batch_size, smoothness, kappa, f0, budget, lr, average)
    mu, rho, noise, avg, b, big_l, kappa, f0, budget, lr = args
    box = _check_search_box(horizon_range, replay_range)
    # As in the asymptotic design: a table knows nothing past its longest staleness.
    x_max = float(getattr(noise, "max_horizon", math.inf))
    if box.x_lo < x_max < box.x_hi:
        box = _check_search_box((box.x_lo, x_max), (box.y_lo, box.y_hi))

    def evaluate(x, y):
        return _finite_bound(x, y, *args)

    opt = _minimise_in_box(evaluate, box)
    x, y = opt.horizon, opt.replay_ratio
    _, eta = evaluate(x, y)
    eta = float(eta)
    r = b / y
    steps = budget / (1 + mu / y)
    n = max(x * r, float(b))  # the optimum may sit on N = B, where x r rounds below B
    result = convergence_bound(buffer_size=n, batch_size=b, rollouts_per_step=r, lr=eta,
                               smoothness=big_l, kappa=kappa, f0=f0, steps=steps, rho=rho,
                               noise=noise, average=avg)
    on_val, _ = evaluate(1.0, 1.0)
    on_val = float(on_val)
    notes = _finite_notes(noise, opt, box, lr=lr, eta=eta, r=r, big_l=big_l, kappa=kappa,
                          x_measured=x_max)
    return FiniteLRDesign(horizon=x, replay_ratio=y, lr=eta, batch_size=b,
                          rollouts_per_step=r, buffer_size=n, steps=steps, bound=result,
                          on_policy_bound=on_val,
                          bound_ratio=result.value / on_val if np.isfinite(on_val) else math.nan,
                          asymptotic=optimal_design(mu, rho, noise, average=avg),
                          notes=tuple(notes))


__all__ = ["Design", "FiniteLRDesign", "objective", "objective_rbn", "optimal_replay_ratio",
           "optimal_horizon",
           "profile_objective", "k_function", "power_law_optimum", "optimal_design",
           "finite_lr_design", "finite_lr_objective", "ON_POLICY", "REPLAY"]
