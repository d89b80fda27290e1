"""The horizon model: what a long buffer buys and what it costs (theory.md section 11).

Section 5's objective charges a buffer through sigma_bar^2(x) and the chance 1/x of drawing
one rollout twice; section 10 adds the self-correlation of a reused rollout. Measured far past
the old 16-step calibration (``panel_fit``), three more things matter for the horizon:

* batch diversity (11.2): rollouts come in groups of G from one prompt and are correlated
  within a group (r). A batch of B fresh rollouts holds B/G prompts and its noise is
  (sigma^2 / B)(1 + (G - 1) r); drawn rollout by rollout from a long buffer it holds nearly B
  prompts. The 1/x term becomes k0 / x with k0 = 1 + (G - 1) r, and on-policy training (each
  rollout once, whole groups) costs k0 instead of 1/y + 1/x.
* correlations across steps that fade with the gap (11.2): a rollout and its group mates at two
  steps g apart, k(g) = c(g) + (G - 1) c_mate(g), summed as section 10.2's pair sum.
* a stale rollout's worth (11.4): w(s), the share of a fresh sample's useful gradient that a
  sample s steps stale still gives (the kept share under the clip, or its alignment with
  grad F), times exp(-a u) for u earlier uses (section 10.4). The step moves along
  w_bar grad F, so w_bar enters as 1 / w_bar^2 (section 10.5).

    J_h(x, y) = sigma_bar^2(x) / w_bar(x, y)^2 (1 + y/mu) (1/y + k0_bar(x)/x + rho + S_k(x)),

with every bar a uniform average over the buffer's staleness 0 .. x - 1 (a FIFO of x steps),
S_k(x) = (2/x) sum_{g=1}^{x-1} (1 - g/x) k(g), and on-policy J_on = sigma^2(0) / w(0)^2
(1 + 1/mu) k0(0). That is for a batch drawn rollout by rollout; drawn in whole groups
(``buffer.sampling`` group modes, section 11.9) every slot has its G - 1 mates in the batch
and the variance factor is k0_bar(x) (1/y + 1/x) + rho + S_k(x) (``draws="groups"``). Horizons are whole steps; the measured curves are interpolated linearly in
the gap and held at their last value beyond the longest measured gap (flagged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import minimize_scalar

from .. import checks
from ..fit.panel_fit import PanelFit

WORTHS = ("kept", "align", "none")
DRAWS = ("rollouts", "groups")  # how a batch is drawn from the buffer (sections 11.2, 11.9)
Y_MIN = 0.25  # the smallest replay ratio searched: a quarter of the rollouts used
POLISHED = 8  # horizons whose replay ratio is polished after the grid search


@dataclass(frozen=True)
class HorizonTerms:
    """The measured curves the horizon model needs, per integer staleness 0 .. len - 1.

    sigma2: squared noise of a sample (> 0). corr, corr_mate: c(g), c_mate(g) in [-1, 1].
    within: r(s), the correlation of two sequences of one group at staleness s. worth: w(s)
    in (0, 1.5]. group_size: G >= 1. rho: coupling of different groups (>= 0). per_use: a >= 0
    per earlier use. measured_gap: the longest gap the curves were measured at (steps).
    """

    sigma2: np.ndarray
    corr: np.ndarray
    corr_mate: np.ndarray
    within: np.ndarray
    worth: np.ndarray
    group_size: int
    rho: float = 0.0
    per_use: float = 0.0
    measured_gap: int = 0

    def __post_init__(self):
        checks.integer("group_size", self.group_size, 1)
        checks.nonnegative("rho", self.rho)
        checks.nonnegative("per_use", self.per_use)
        if np.any(np.asarray(self.sigma2) <= 0):
            raise ValueError("sigma2 must be > 0 at every staleness")
        if np.any(np.asarray(self.worth) <= 0):
            raise ValueError("worth must be > 0 at every staleness (a stale sample that gives "
                             "nothing would make every buffer infinitely dear)")

    @property
    def length(self) -> int:
        return len(self.sigma2)


def _table(curve, length: int) -> np.ndarray:
    """A measured curve at integer staleness 0 .. length - 1: linear between the measured
    gaps, held at the last value beyond."""
    return np.interp(np.arange(length, dtype=float), curve.gaps, curve.value)


def terms_from_fit(fit: PanelFit, *, worth: str = "kept", rho: float = 0.0,
                   per_use: float = 0.0, length: int = 1025) -> HorizonTerms:
    """The model's curves from a ``PanelFit``; ``worth`` picks w(s) ("kept": the clip's kept
    share; "align": the panel mean gradient's component along grad F; "none": 1); ``length``
    >= 2 staleness values tabulated (horizons up to ``length``)."""
    checks.choice("worth", worth, WORTHS)
    checks.integer("length", length, 2)
    w = np.ones(length) if worth == "none" else _table(getattr(fit, worth), length)
    sigma2 = _table(fit.sigma2, length)
    if np.any(sigma2 <= 0) or np.any(w <= 0):
        raise ValueError(f"the panel fit gives a non-positive {'sigma2' if np.any(sigma2 <= 0) else worth} "
                         f"at some staleness: too few panels to fit the horizon model")
    return HorizonTerms(sigma2=sigma2, corr=_table(fit.corr, length),
                        corr_mate=_table(fit.corr_mate, length),
                        within=_table(fit.within, length), worth=np.minimum(w, 1.5),
                        group_size=fit.group_size, rho=rho, per_use=per_use,
                        measured_gap=int(max(fit.sigma2.gaps)))


def staleness_means(sigma2, worth, within, k, group_size: int) -> dict:
    """Buffer means along the last axis (staleness s = 0 .. n - 1) for every horizon
    x = 1 .. n (sections 11.2, 11.5): "sigma_bar2" and "worth_bar" (plain means over s < x),
    "k0" = 1 + (G - 1) mean r, and "buffer" = k0 / x + S_k(x), the variance factor's buffer
    part, with k(g) the cross-step correlation (k[..., 0] is ignored: the same step is k0)."""
    sigma2, worth, within, k = (np.asarray(a, float) for a in (sigma2, worth, within, k))
    n = sigma2.shape[-1]
    x = np.arange(1, n + 1, dtype=float)
    g = np.arange(n, dtype=float)
    k = k.copy()
    k[..., 0] = 0.0
    cum_k, cum_gk = np.cumsum(k, -1), np.cumsum(g * k, -1)
    pair = 2.0 / x * (cum_k - cum_gk / x)
    k0 = 1 + (group_size - 1) * np.cumsum(within, -1) / x
    return {"sigma_bar2": np.cumsum(sigma2, -1) / x, "worth_bar": np.cumsum(worth, -1) / x,
            "buffer": k0 / x + pair, "k0": k0}


def _buffer_parts(terms: HorizonTerms) -> dict:
    """``staleness_means`` of the terms, indexed by x - 1."""
    return staleness_means(terms.sigma2, terms.worth, terms.within,
                           terms.corr + (terms.group_size - 1) * terms.corr_mate,
                           terms.group_size)


def _worth_bar(terms: HorizonTerms, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """w_bar(x, y): mean over staleness s < x of w(s) exp(-(y/x)(1 - e^-a) s) (section 11.4)."""
    if terms.per_use == 0:  # no use-count term: the plain buffer average of w
        x_b, _ = np.broadcast_arrays(np.asarray(x, float), np.asarray(y, float))
        return (np.cumsum(terms.worth) / np.arange(1, terms.length + 1))[
            x_b.astype(int) - 1]
    s = np.arange(terms.length, dtype=float)
    rate = -np.asarray(y, float)[..., None] / np.asarray(x, float)[..., None] \
        * math.expm1(-terms.per_use)
    inside = s < np.asarray(x, float)[..., None]
    vals = np.where(inside, terms.worth * np.exp(-rate * s), 0.0)
    return vals.sum(-1) / np.asarray(x, float)


def objective(terms: HorizonTerms, horizon, replay_ratio, *, mu: float,
              draws: str = "rollouts") -> np.ndarray:
    """J_h(x, y) of section 11.5 at integer horizons 1 <= x <= terms.length (steps) and
    replay ratios y > 0, elementwise (broadcast); mu > 0. ``draws`` (``DRAWS``): a batch drawn
    rollout by rollout (section 11.5) or in whole groups of G, with replacement (section
    11.9: the 1/y term carries k0_bar(x))."""
    checks.positive("mu", mu)
    checks.choice("draws", draws, DRAWS)
    x, y = np.broadcast_arrays(np.asarray(horizon, float), np.asarray(replay_ratio, float))
    if np.any(x < 1) or np.any(x > terms.length) or np.any(x != np.round(x)):
        raise ValueError(f"horizon must be a whole number of steps in [1, {terms.length}]")
    if np.any(y <= 0):
        raise ValueError("replay_ratio must be > 0")
    parts = _buffer_parts(terms)
    i = x.astype(int) - 1
    # Group draws put each slot's G - 1 mates in the batch: k0_bar / y (section 11.9).
    fresh = 1 / y if draws == "rollouts" else parts["k0"][i] / y
    var = fresh + terms.rho + parts["buffer"][i]
    return parts["sigma_bar2"][i] / _worth_bar(terms, x, y) ** 2 * (1 + y / mu) * var


def on_policy(terms: HorizonTerms, *, mu: float) -> float:
    """J of on-policy training (each rollout used once, whole groups): sigma^2(0) / w(0)^2
    (1 + 1/mu) k0(0) (section 11.5); mu > 0."""
    checks.positive("mu", mu)
    k0 = 1 + (terms.group_size - 1) * terms.within[0]
    return float(terms.sigma2[0] / terms.worth[0] ** 2 * (1 + 1 / mu) * k0)


@dataclass(frozen=True)
class HorizonDesign:
    """The horizon model's optimum at one mu: x* (steps) and y*, J there and on-policy, the
    predicted saving 1 - J*/J_on, and flags: x* at the tabulated limit (the search's edge),
    x* past the longest measured gap (the curves were held constant there)."""

    horizon: int
    replay_ratio: float
    objective: float
    on_policy: float
    saving: float
    at_limit: bool
    extrapolated: bool

    @property
    def on_policy_best(self) -> bool:
        """No buffer beats on-policy training (the recommendation is then on-policy)."""
        return self.saving <= 0

    def to_dict(self) -> dict:
        return {**self.__dict__, "on_policy_best": self.on_policy_best}


def optimal_design(terms: HorizonTerms, *, mu: float, max_horizon: int | None = None,
                   max_replay: float | None = None, draws: str = "rollouts") -> HorizonDesign:
    """Minimise J_h over integer 1 <= x <= max_horizon (default terms.length) and
    Y_MIN <= y <= min(x, max_replay) (N >= B: y <= x): a log grid in y per x, then Brent's
    method in y at the ``POLISHED`` horizons with the lowest grid minima (section 11.5).
    ``draws``: as in ``objective`` (section 11.9)."""
    checks.positive("mu", mu)
    checks.choice("draws", draws, DRAWS)
    top = terms.length if max_horizon is None else checks.integer("max_horizon", max_horizon, 1,
                                                             terms.length)
    x = np.arange(1, top + 1, dtype=float)
    ys = np.exp(np.linspace(math.log(Y_MIN), math.log(max(top, 2.0)), 161))
    cap = x[:, None] if max_replay is None else np.minimum(x[:, None], max_replay)
    yy = np.where(ys[None, :] <= cap, ys[None, :], np.nan)
    xx = np.broadcast_to(x[:, None], yy.shape)
    j = np.full(yy.shape, np.inf)
    ok = ~np.isnan(yy)
    j[ok] = objective(terms, xx[ok], yy[ok], mu=mu, draws=draws)
    # The surface is often flat in x: polish y at the few horizons whose grid minima lead.
    best = (np.inf, 0, 0.0)
    for i in np.argsort(j.min(1))[:POLISHED]:
        k = int(np.argmin(j[i]))
        hi = float(cap[i, 0]) if np.ndim(cap) else float(cap)
        res = minimize_scalar(lambda yv: float(objective(terms, x[i], yv, mu=mu, draws=draws)),
                              bounds=(float(ys[max(k - 1, 0)]),
                                      min(float(ys[min(k + 1, len(ys) - 1)]), hi)),
                              method="bounded")
        for jv, yv in ((res.fun, res.x), (j[i, k], ys[k])):
            if jv < best[0]:
                best = (float(jv), int(i), float(yv))
    j_best, i, y_best = best
    j_on = on_policy(terms, mu=mu)
    return HorizonDesign(horizon=int(x[i]), replay_ratio=float(y_best),
                         objective=float(j_best), on_policy=j_on,
                         saving=float(1 - j_best / j_on), at_limit=bool(x[i] == top),
                         extrapolated=bool(x[i] > terms.measured_gap + 1))


ABLATIONS = ("diversity", "fading", "worth", "noise")


def ablate(terms: HorizonTerms, term: str) -> HorizonTerms:
    """The model with one mechanism switched off (section 11.6): "diversity" (r = 0 and
    c_mate = 0: groups no more alike than any two rollouts), "fading" (c(g) and c_mate(g)
    held at their gap-1 values: correlations that never fade), "worth" (w = 1: a stale
    sample worth a fresh one) or "noise" (sigma^2 held at its staleness-0 value)."""
    checks.choice("term", term, ABLATIONS)
    if term == "diversity":
        zero = np.zeros(terms.length)
        return replace(terms, within=zero, corr_mate=zero)
    if term == "fading":
        return replace(terms, corr=np.full(terms.length, terms.corr[min(1, terms.length - 1)]),
                       corr_mate=np.full(terms.length,
                                         terms.corr_mate[min(1, terms.length - 1)]))
    if term == "worth":
        return replace(terms, worth=np.ones(terms.length), per_use=0.0)
    return replace(terms, sigma2=np.full(terms.length, terms.sigma2[0]))


def model_terms(fit: PanelFit, used: dict, length: int, worth: str = "kept") -> HorizonTerms:
    """The horizon model of a ``PanelFit`` with the terms ``used`` ({term: bool}, the
    mechanisms the probes support, section 11.6) on and the others switched off; ``worth``
    as in ``terms_from_fit`` (the kept share by default, section 11.4)."""
    terms = terms_from_fit(fit, worth=worth, length=length)
    for term, on in used.items():
        if not on:
            terms = ablate(terms, term)
    return terms


def section5_terms(terms: HorizonTerms) -> HorizonTerms:
    """Section 5's J with the same noise table: every section-11 term switched off
    (single-rollout groups, no correlation across steps, every sample worth a fresh one)."""
    zero = np.zeros(terms.length)
    return HorizonTerms(sigma2=terms.sigma2, corr=zero, corr_mate=zero, within=zero,
                        worth=np.ones(terms.length), group_size=1,
                        measured_gap=terms.measured_gap)


def objective_at_cells(terms: HorizonTerms, horizons, ratios, *, mu: float,
                       on_policy_cell: int | None = None) -> np.ndarray:
    """J at grid cells (x whole, 1 <= x <= terms.length; y > 0), the on-policy cell (index,
    or None) scored as on-policy training (``on_policy``); section 11.5."""
    x = np.asarray(horizons, dtype=float)
    y = np.asarray(ratios, dtype=float)
    out = np.empty(x.shape)
    rest = np.ones(x.shape, bool)
    if on_policy_cell is not None:
        out[on_policy_cell] = on_policy(terms, mu=mu)
        rest[on_policy_cell] = False
    out[rest] = objective(terms, x[rest], y[rest], mu=mu)
    return out


def used_terms(horizon_model: dict) -> dict:
    """{term: bool} of a registration's ``horizon_model`` record: the mechanisms its probes
    supported (section 11.6), the others switched off when the model is rebuilt."""
    return {t: bool(v["used"]) for t, v in horizon_model["supported"].items()}


def registered_terms(horizon_model: dict, length: int) -> tuple:
    """(the horizon model, section 5's) of a registration's ``horizon_model`` record
    (``llm_experiments.study.horizon_predict``), rebuilt from the panel fit it holds and the terms
    it used; ``length`` staleness values tabulated (horizons up to it)."""
    terms = model_terms(PanelFit.from_dict(horizon_model["panel_fit"]),
                        used_terms(horizon_model), length=length)
    return terms, section5_terms(terms)