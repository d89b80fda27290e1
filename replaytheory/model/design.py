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

One search serves every asymptotic design: ``search_design`` takes an objective
(``Section5Objective`` here, ``reuse.ReuseObjective`` for section 10's variants) and returns
one result type, ``Design``, whose caveats are ``Caveat`` flags (``notes`` words them).

Finite step size: ``finite_lr_design`` minimises the Theorem's full bound (section 4), kappa
term included, at a fixed batch size and compute budget, over (x, y) and, if asked, eta.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from .. import checks
from .bound import BoundResult, bound_value, convergence_bound, step_size_limit
from .noise import A3_NOTE, AVERAGES, NoiseModel, PowerLawNoise, a3_notes
from .search import (LOG_X_GRID, BoxOptimum, SearchBox, minimise_in_box,
                     minimise_over_horizon)

ON_POLICY = "on-policy"
REPLAY = "replay"
STANDARD = "standard"  # section 5's objective, no section 10 term: a design's ``variant``
METHODS = ("auto", "numeric", "closed_form")


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


class Caveat(enum.Enum):
    """What a design's numbers cannot say on their own (``Design.caveats``); ``Design.notes``
    gives each as a sentence."""

    A3_BROKEN = "a3_broken"  # sigma^2 decreases somewhere: the theorem does not cover it
    HORIZON_AT_SEARCH_EDGE = "horizon_at_search_edge"  # x* on a side of the 2-D search box
    REPLAY_RATIO_AT_SEARCH_EDGE = "replay_ratio_at_search_edge"  # y* likewise
    AT_MEASURED_EDGE = "at_measured_edge"  # x* at a noise table's longest horizon
    UNBOUNDED = "unbounded"  # J keeps falling as x grows: x* = inf
    NOISE_TOO_STEEP = "noise_too_steep"  # power law with alpha >= 1/2: on-policy
    DEGENERATE = "degenerate"  # J(x*, y*) = 0 (sigma(0) = 0, discrete average)
    NO_ON_POLICY_REFERENCE = "no_on_policy_reference"  # J(1, 1) = 0: j_ratio undefined


@dataclass(frozen=True)
class Design:
    """The continuous optimum of a design objective and what it implies: section 5's J
    (``variant`` "standard") or one of section 10's reuse-aware ones.

    Attributes:
        variant: "standard" or one of ``reuse.VARIANTS``. mu, rho: the inputs.
        noise: the noise model's dict. average: sigma_bar^2 average used.
        method: "closed_form" or "numeric".
        horizon: x* = N/R in steps; below 1 signals the on-policy regime; 0 means the infimum
            is at x -> 0 (e.g. alpha >= 1/2); inf means "as long as allowed" (e.g. alpha = 0).
        replay_ratio: y* = B/R, average uses per rollout.
        objective: J(x*, y*); on_policy_objective: J(1, 1).
        j_ratio: J(x*, y*) / J(1, 1) in the replay regime, 1 in the on-policy regime (the
            recommendation is then on-policy training itself).
        predicted_saving: 1 - j_ratio, the predicted fraction of compute saved against
            on-policy training to reach the same bound (section 5).
        regime: "on-policy" (x* < 1) or "replay".
        reuse, contribution: the section 10 terms' dicts (None if absent).
        pair_sum: S(x*) (0 without a reuse term). contribution_mean: f_bar(x*, y*) (1
            without a contribution term).
        search_box: where the two-dimensional search looked (None if it did not run).
        caveats: ``Caveat`` members, in their declaration order; ``notes`` says them.
    """

    variant: str
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
    reuse: dict | None = None
    contribution: dict | None = None
    pair_sum: float = 0.0
    contribution_mean: float = 1.0
    search_box: SearchBox | None = None
    caveats: tuple[Caveat, ...] = ()

    @property
    def notes(self) -> tuple[str, ...]:
        """The caveats as sentences for people (derived from ``caveats``)."""
        return tuple(self._note(c) for c in self.caveats)

    def _note(self, caveat: Caveat) -> str:
        box = self.search_box
        if caveat is Caveat.A3_BROKEN:
            return A3_NOTE
        if caveat is Caveat.HORIZON_AT_SEARCH_EDGE:
            return (f"the horizon optimum lies on the edge of its search range "
                    f"[{box.x_lo:.3g}, {box.x_hi:.3g}]")
        if caveat is Caveat.REPLAY_RATIO_AT_SEARCH_EDGE:
            return (f"the replay_ratio optimum lies on the edge of its search range "
                    f"[{box.y_lo:.3g}, {box.y_hi:.3g}]")
        if caveat is Caveat.AT_MEASURED_EDGE:
            return measured_edge_note(self.horizon)
        return _FIXED_NOTES[caveat]

    def to_dict(self) -> dict:
        d = {k: val for k, val in self.__dict__.items() if k not in ("search_box", "caveats")}
        d["search_box"] = None if self.search_box is None else self.search_box.to_dict()
        d["caveats"] = [c.value for c in self.caveats]
        d["notes"] = list(self.notes)
        return d


_FIXED_NOTES = {
    Caveat.UNBOUNDED: "the objective keeps falling as the horizon grows (noise does not grow "
                      "with staleness): the best buffer is as large as other limits allow",
    Caveat.NOISE_TOO_STEEP: "alpha >= 1/2: staleness noise grows too fast for any buffer to "
                            "pay off",
    Caveat.DEGENERATE: "the objective vanishes at short horizons (sigma(0) = 0 with the "
                       "discrete average): the design is degenerate; use the continuous "
                       "average or a model with sigma(0) > 0",
    Caveat.NO_ON_POLICY_REFERENCE: "sigma_bar^2(1) = 0 under this model and average (sigma(0) "
                                   "= 0): the on-policy reference J(1, 1) vanishes and the "
                                   "ratio is undefined",
}


def measured_edge_note(x_max: float) -> str:
    """The caveat of an optimum at a measured noise table's longest horizon ``x_max`` (steps;
    theory.md section 4.6): a lower bound, not an optimum."""
    return (f"the optimum sits at the longest measured horizon ({x_max:g} steps): the table "
            "cannot tell whether a longer horizon is better; measure longer staleness or use "
            "a parametric model")


@dataclass(frozen=True)
class Section5Objective:
    """Section 5's J(x, y) as ``search_design`` sees it. Section 10's objectives
    (``reuse.ReuseObjective``) override the methods whose answer changes with their terms.

    mu > 0, rho in [0, 1], a noise model and its sigma_bar^2 average ("discrete" or
    "continuous"), all checked by the caller.
    """

    mu: float
    rho: float
    noise: NoiseModel
    average: str

    # Why method="closed_form" was refused: the closed form's preconditions.
    closed_form_requirement = ("method='closed_form' needs a PowerLawNoise with "
                               "average='continuous'")

    @property
    def variant(self) -> str:
        return STANDARD

    @property
    def x_max(self) -> float:
        """The longest horizon searched (steps): a noise table's measured range, else inf."""
        return float(getattr(self.noise, "max_horizon", math.inf))

    @property
    def profiled(self) -> bool:
        """y*(x) is known in closed form, so the search runs over x alone."""
        return True

    def value(self, x, y) -> np.ndarray:
        """J(x, y), vectorised (section 5)."""
        return objective(x, y, mu=self.mu, rho=self.rho, noise=self.noise,
                         average=self.average)

    def log_value(self, x, y) -> np.ndarray:
        """log J(x, y), +inf where J is not finite and positive (the two-dimensional search)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.log(self.value(x, y))
        return np.where(np.isfinite(out), out, np.inf)

    def log_profile(self, u) -> np.ndarray:
        """log min_y J(e^u, y) = log sigma_bar^2(x) + 2 log(1/sqrt(mu) + sqrt(rho + 1/x))."""
        c = 1.0 / math.sqrt(self.mu)
        return (_log_sigma_bar2(self.noise, np.exp(u), self.average)
                + 2 * np.log(c + np.sqrt(self.rho + np.exp(-u))))

    def closed_form(self) -> tuple[float, float] | None:
        """(x*, y*) of ``power_law_optimum``, or None where it does not apply."""
        if isinstance(self.noise, PowerLawNoise) and self.average == "continuous":
            return power_law_optimum(self.mu, self.rho, self.noise.alpha)
        return None

    def closed_form_holds(self, horizon: float) -> bool:
        """Whether the closed form's x* = ``horizon`` is the optimum (always, in section 5)."""
        return True

    def ratio_at(self, horizon: float) -> float:
        """y*(x) at the searched x* (0 at x = 0; its limit sqrt(mu / rho) at x = inf)."""
        if horizon == 0.0:
            return 0.0
        if math.isinf(horizon):
            return math.sqrt(self.mu / self.rho) if self.rho > 0 else math.inf
        return float(optimal_replay_ratio(horizon, mu=self.mu, rho=self.rho))

    def value_at(self, horizon: float, replay_ratio: float, on_policy_value: float) -> float:
        """J at the optimum, its limits at x = 0 (the profile at the grid's shortest
        horizons) and x or y = inf (sigma_bar^2 far out times the profile's limit)."""
        if horizon == 0.0:
            x = np.exp(LOG_X_GRID[:3])
            return float(np.exp(np.min(_log_sigma_bar2(self.noise, x, self.average) + 2 * np.log(
                1 / math.sqrt(self.mu) + np.sqrt(self.rho + 1 / x)))))
        if math.isinf(horizon) or math.isinf(replay_ratio):
            return float(np.exp(_log_sigma_bar2(self.noise, 1e15, self.average))
                         * (1 / math.sqrt(self.mu) + math.sqrt(self.rho)) ** 2)
        return float(self.value(horizon, replay_ratio))

    def terms_at(self, horizon: float, replay_ratio: float) -> tuple[float, float]:
        """(S(x*), f_bar(x*, y*)): no reuse term, no contribution term."""
        return 0.0, 1.0

    def term_dicts(self) -> tuple[dict | None, dict | None]:
        """The (reuse, contribution) models' dicts."""
        return None, None


def search_design(model: Section5Objective, method: str = "auto") -> Design:
    """The optimum (x*, y*) of a design objective and its ``Design`` (theory.md sections 5
    and 10).

    ``model``: ``Section5Objective`` or ``reuse.ReuseObjective``, checked. ``method``: "auto"
    (the model's closed form where it has one and it holds, else numeric), "numeric" or
    "closed_form" (ValueError if the model has none). Numeric: over x with y*(x) in closed
    form when ``model.profiled``, else over (x, y) in a box (``search.minimise_in_box``).
    """
    method = checks.choice("method", method, METHODS)
    closed = model.closed_form()
    if method == "closed_form" and closed is None:
        raise ValueError(model.closed_form_requirement)
    used, box = "numeric", None
    caveats = {Caveat.A3_BROKEN} if not model.noise.satisfies_a3 else set()
    if closed is not None and method != "numeric":
        x, y = closed
        if method == "closed_form" or model.closed_form_holds(x):
            used = "closed_form"
    if used == "numeric" and model.profiled:
        x = minimise_over_horizon(model.log_profile, model.x_max)
        y = model.ratio_at(x)
    elif used == "numeric":
        box = SearchBox(x_lo=1e-3, x_hi=min(model.x_max, 1e6), y_lo=1e-3, y_hi=1e4)
        opt = minimise_in_box(model.log_value, box, points=241, xatol=1e-10, fatol=1e-13)
        if opt is None:
            raise ValueError("the reuse-aware objective is not finite at any (x, y)")
        x, y = opt.horizon, opt.replay_ratio
        caveats |= {Caveat.HORIZON_AT_SEARCH_EDGE} if opt.horizon_at_edge else set()
        caveats |= {Caveat.REPLAY_RATIO_AT_SEARCH_EDGE} if opt.ratio_at_edge else set()
    if math.isfinite(model.x_max) and x >= model.x_max * (1 - 1e-9):
        caveats.add(Caveat.AT_MEASURED_EDGE)
    if math.isinf(x):
        caveats.add(Caveat.UNBOUNDED)
    if isinstance(model.noise, PowerLawNoise) and model.noise.alpha >= 0.5:
        caveats.add(Caveat.NOISE_TOO_STEEP)
    return _design_at(model, x, y, method=used, box=box, caveats=caveats)


def _design_at(model: Section5Objective, x: float, y: float, *, method: str,
               box: SearchBox | None, caveats: set) -> Design:
    """The ``Design`` of the optimum (x, y): J there against on-policy's J(1, 1)."""
    j_on = float(model.value(1.0, 1.0))
    j_star = model.value_at(x, y, j_on)
    if j_star == 0.0:
        caveats.add(Caveat.DEGENERATE)
    regime = ON_POLICY if x < 1.0 else REPLAY
    if regime == ON_POLICY:
        j_ratio = 1.0
    elif j_on > 0:
        j_ratio = j_star / j_on
    else:
        j_ratio = math.nan
        caveats.add(Caveat.NO_ON_POLICY_REFERENCE)
    pair_sum, contribution_mean = model.terms_at(x, y)
    reuse, contribution = model.term_dicts()
    return Design(variant=model.variant, mu=model.mu, rho=model.rho,
                  noise=model.noise.to_dict(), average=model.average, method=method,
                  horizon=float(x), replay_ratio=float(y), objective=j_star,
                  on_policy_objective=j_on, j_ratio=j_ratio, predicted_saving=1.0 - j_ratio,
                  regime=regime, reuse=reuse, contribution=contribution, pair_sum=pair_sum,
                  contribution_mean=contribution_mean, search_box=box,
                  caveats=tuple(c for c in Caveat if c in caveats))


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
    return minimise_over_horizon(
        lambda u: _log_sigma_bar2(noise, np.exp(u), avg) + np.log(1 / y + rho + np.exp(-u)),
        x_max)


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
        ``Design`` (variant "standard"). x* below 1 step is a valid answer: the on-policy
        regime. ``optimal_config`` turns it into integers and a GPU split.
    """
    mu = checks.positive("mu", mu)
    rho = checks.unit_interval("rho", rho)
    _check_noise(noise)
    method = checks.choice("method", method, METHODS)
    avg = noise.default_average if average is None else checks.choice(
        "average", average, AVERAGES)
    return search_design(Section5Objective(mu=mu, rho=rho, noise=noise, average=avg), method)


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


def _positive_cubic_root(a: float, b: float, c: float) -> float:
    """The positive root of 2c eta^3 + b eta^2 - a (a, c > 0, b >= 0): the cubic rises on
    eta > 0 from -a, and it is >= 0 at cbrt(a / 2c) and, for b > 0, at sqrt(a / b)."""
    from scipy.optimize import brentq
    top = (a / (2 * c)) ** (1 / 3)
    if b > 0:
        top = min(top, math.sqrt(a / b))
    # 1.001: past the bound's rounding, the cubic is surely positive at the top.
    return brentq(lambda eta: (2 * c * eta + b) * eta * eta - a, 0.0, 1.001 * top, xtol=1e-300,
                  rtol=4 * np.finfo(float).eps)


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
            # With c tiny against b (kappa ~ 1e-30) the companion matrix loses the small
            # roots to the huge negative one: bracket the one positive root instead.
            out[...] = real.real.min() if real.size else _positive_cubic_root(ai, bi, ci)
        elif bi > 0:
            out[...] = math.sqrt(ai / bi)
        else:
            out[...] = np.inf
    return np.minimum(eta, limit)


@dataclass(frozen=True)
class _FiniteBound:
    """The checked inputs of the Theorem's bound at a fixed batch and budget (section 4):
    mu > 0, rho in [0, 1], the noise model and its average, batch_size B >= 1, smoothness
    L > 0, kappa >= 0, f0 >= 0, budget > 0 (trainer updates), lr in (0, 1/(2L)) or None
    (optimised per point). Build it with ``checked``."""

    mu: float
    rho: float
    noise: NoiseModel
    average: str
    batch_size: int
    smoothness: float
    kappa: float
    f0: float
    budget: float
    lr: float | None

    @classmethod
    def checked(cls, mu, rho, noise, *, batch_size, smoothness, kappa, f0, budget, lr,
                average) -> _FiniteBound:
        """The record from raw arguments; ValueError names the first one out of range."""
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
        return cls(mu=mu, rho=rho, noise=noise, average=avg, batch_size=b, smoothness=big_l,
                   kappa=kappa, f0=f0, budget=budget, lr=lr)

    def bound(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        """(bound, eta) at (x, y), vectorised; eta optimal per point if lr is None; +inf
        where y > x (N < B)."""
        b, big_l, kappa = self.batch_size, self.smoothness, self.kappa
        x, y = np.broadcast_arrays(np.asarray(x, float), np.asarray(y, float))
        r = b / y
        n = x * r
        steps = self.budget / (1 + self.mu / y)
        sb2 = self.noise.sigma_bar2(x, self.average)
        var = sb2 * (1 / b + 1 / n + self.rho / r)
        limit = np.full(x.shape, (1 - 1e-9) / (2 * big_l))
        if kappa > 0:
            limit = np.minimum(limit, 1 / (2 * math.sqrt(2) * kappa * x))
        if self.lr is None:
            eta = _best_lr(12 * self.f0 / steps, 8 * big_l * var,
                           32 * x**2 * kappa**2 * var, limit)
        else:
            eta = np.full(x.shape, self.lr)
        val = bound_value(n, b, r, eta, big_l, kappa, self.f0, steps, self.rho, sb2)
        return np.where(y <= x, val, np.inf), eta  # N >= B: a batch is drawn from the buffer

    def log_bound(self, x, y) -> np.ndarray:
        """log of the bound, +inf where it is not finite and positive (for the search)."""
        val, _ = self.bound(x, y)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.log(val)
        return np.where(np.isfinite(out), out, np.inf)


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
    inputs = _FiniteBound.checked(mu, rho, noise, batch_size=batch_size, smoothness=smoothness,
                                  kappa=kappa, f0=f0, budget=budget, lr=lr, average=average)
    return inputs.bound(horizon, replay_ratio)


def _check_search_box(horizon_range, replay_range) -> SearchBox:
    """Validate ``finite_lr_design``'s (lo, hi) ranges: positive, lo < hi."""
    x_lo, x_hi = (checks.positive("horizon_range[0]", horizon_range[0]),
                  checks.positive("horizon_range[1]", horizon_range[1]))
    y_lo, y_hi = (checks.positive("replay_range[0]", replay_range[0]),
                  checks.positive("replay_range[1]", replay_range[1]))
    if x_lo >= x_hi or y_lo >= y_hi:
        raise ValueError("horizon_range and replay_range must be (lo, hi) with lo < hi")
    return SearchBox(x_lo=x_lo, x_hi=x_hi, y_lo=y_lo, y_hi=y_hi)


def _finite_notes(noise, opt: BoxOptimum, box: SearchBox, *, lr, eta: float, r: float,
                  big_l: float, kappa: float, x_measured: float = math.inf) -> list[str]:
    """Caveats of a finite-step design: A3 (``a3_notes``), an optimum on the edge of the
    search box or at the longest measured horizon ``x_measured``, an optimised step size eta
    on the theorem's limit (theory.md section 4.4)."""
    x = opt.horizon
    notes = list(a3_notes(noise))
    # The box's x edge is the table's, not a search choice: say that, not "widen it".
    at_table_edge = box.x_hi == x_measured and x >= x_measured * (1 - 1e-6)
    if at_table_edge:
        notes.append(measured_edge_note(x_measured))
    for name, at_edge, lo_, hi_ in (
            ("horizon", opt.horizon_at_edge and not at_table_edge, box.x_lo, box.x_hi),
            ("replay_ratio", opt.ratio_at_edge, box.y_lo, box.y_hi)):
        if at_edge:
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
    inputs = _FiniteBound.checked(mu, rho, noise, batch_size=batch_size, smoothness=smoothness,
                                  kappa=kappa, f0=f0, budget=budget, lr=lr, average=average)
    box = _check_search_box(horizon_range, replay_range)
    # As in the asymptotic design: a table knows nothing past its longest staleness.
    x_max = float(getattr(noise, "max_horizon", math.inf))
    capped = box.x_lo < x_max < box.x_hi
    opt = minimise_in_box(inputs.log_bound, box, points=81, xatol=1e-9, fatol=1e-12,
                          x_cap=x_max if capped else math.inf)
    if capped:
        box = _check_search_box((box.x_lo, x_max), (box.y_lo, box.y_hi))
    if opt is None:
        raise ValueError("no admissible (horizon, replay_ratio) in the search box: the step "
                         "size is too large for every horizon, or the budget allows <= 1 step")
    return _finite_design_at(inputs, opt, box, x_max)


def _finite_design_at(inputs: _FiniteBound, opt: BoxOptimum, box: SearchBox,
                      x_max: float) -> FiniteLRDesign:
    """The ``FiniteLRDesign`` of the box optimum ``opt``: the bound there and at x = y = 1."""
    x, y, b = opt.horizon, opt.replay_ratio, inputs.batch_size
    eta = float(inputs.bound(x, y)[1])
    r = b / y
    steps = inputs.budget / (1 + inputs.mu / y)
    n = max(x * r, float(b))  # the optimum may sit on N = B, where x r rounds below B
    result = convergence_bound(buffer_size=n, batch_size=b, rollouts_per_step=r, lr=eta,
                               smoothness=inputs.smoothness, kappa=inputs.kappa, f0=inputs.f0,
                               steps=steps, rho=inputs.rho, noise=inputs.noise,
                               average=inputs.average)
    on_val = float(inputs.bound(1.0, 1.0)[0])
    notes = _finite_notes(inputs.noise, opt, box, lr=inputs.lr, eta=eta, r=r,
                          big_l=inputs.smoothness, kappa=inputs.kappa, x_measured=x_max)
    return FiniteLRDesign(horizon=x, replay_ratio=y, lr=eta, batch_size=b,
                          rollouts_per_step=r, buffer_size=n, steps=steps, bound=result,
                          on_policy_bound=on_val,
                          bound_ratio=result.value / on_val if np.isfinite(on_val) else math.nan,
                          asymptotic=optimal_design(inputs.mu, inputs.rho, inputs.noise,
                                                    average=inputs.average),
                          notes=tuple(notes))


__all__ = ["Caveat", "Design", "FiniteLRDesign", "Section5Objective", "STANDARD", "objective",
           "objective_rbn", "optimal_replay_ratio", "optimal_horizon", "profile_objective",
           "k_function", "power_law_optimum", "optimal_design", "search_design",
           "measured_edge_note", "finite_lr_design", "finite_lr_objective", "ON_POLICY",
           "REPLAY"]
