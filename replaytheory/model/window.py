"""The horizon over a finite run: a buffer that fills, terms that change as the policy learns,
and a score that weighs early progress more (theory.md section 11.12).

Section 11.5's J_h is a steady state: every update draws from a full buffer of x steps and the
panel terms are the same at every step. A run of T updates scored by its AUC differs in three
ways, each of which scales with T:

* **fill-up**: at update t only t + 1 steps of rollouts exist, so a buffer of x steps draws
  from x_eff(t) = min(x, t + 1) of them;
* **phase**: a rollout's worth, noise and correlations depend on when it was made (panels
  born late in a run, ``PhasedTerms``); a rollout s steps stale at update t was born at t - s,
  and its terms are interpolated linearly in the birth step between the measured births
  (held at the first and last);
* **AUC weighting**: with accuracy rising by the progress made, the AUC over a budget C is
  sum_t rho(t) (1 - t/n) over the n = C / (1 + mu/y) updates the budget buys, so progress at
  update t weighs (1 - t/n): early updates count more.

Per update the variance of the step, in units of sigma^2 / B, is (section 11.2, 11.5, times y)

    V(x, y; t) = sigma_bar^2 / w_bar^2 (1 + y (k0_bar / x_eff + rho + S_k(x_eff)))

(rollout draws; group draws: k0_bar (1 + y / x_eff) + y (rho + S_k)), every bar a mean over
the buffer's rollouts s = 0 .. x_eff - 1 with each one's birth-phase terms, and on-policy
V_on(t) = sigma^2(0) / w(0)^2 k0(0) at the phase of t. At a small tuned step the progress of
an update is proportional to 1 / V (section 5.1), and on-policy training is taken to progress
at the same rate in every phase (the weight of a phase is on-policy's), so a design's rate
relative to on-policy is rho(x, y; t) = V_on(t) / V(x, y; t) and its score is

    S(x, y) = sum_{t < n(y)} (1 - t / n(y)) rho(x, y; t),  n(y) = T (1 + mu / y_max) / (1 + mu / y),

T the run's updates and y_max the grid's largest replay ratio (the AUC budget of section 8.3:
the cheapest cell's compute). On-policy scores S_on = sum_{t < n_on} (1 - t / n_on) with
n_on = T (1 + mu / y_max) / (1 + mu). The design objective is J_T(x, y) = S_on / S(x, y)
(lower is better, 1 = on-policy). For T -> infinity with one phase and x << T it orders
designs as J_h does (the sum tends to n / (2 V), and n / V is 1 / J_h up to a constant).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar

from .. import checks
from ..fit.panel_fit import PanelFit
from .horizon import (DRAWS, POLISHED, Y_MIN, HorizonTerms, model_terms, staleness_means,
                      used_terms)


@dataclass(frozen=True)
class PhasedTerms:
    """The horizon terms of panels born at different steps of a run (section 11.12).

    births: the birth steps (>= 0, increasing) the terms were measured at; terms: one
    ``HorizonTerms`` per birth, all with the same group size and table length.
    """

    births: tuple
    terms: tuple

    def __post_init__(self):
        if len(self.births) != len(self.terms) or not self.births:
            raise ValueError("births and terms must be non-empty and of equal length")
        b = np.asarray(self.births, float)
        if np.any(b < 0) or np.any(np.diff(b) <= 0):
            raise ValueError(f"births must be >= 0 and increasing, got {list(self.births)}")
        if len({(t.group_size, t.length, t.rho) for t in self.terms}) != 1:
            raise ValueError("every phase's terms must share group_size, length and rho")

    @property
    def length(self) -> int:
        return self.terms[0].length


def _birth_weights(births, steps: int) -> np.ndarray:
    """(steps, phases) weights of each measured birth for a rollout born at 0 .. steps - 1:
    linear in the birth step between measured births, the nearest one held outside them."""
    b = np.asarray(births, float)
    out = np.zeros((steps, len(b)))
    for p in range(len(b)):
        unit = np.zeros(len(b))
        unit[p] = 1.0
        out[:, p] = np.interp(np.arange(steps, dtype=float), b, unit)
    return out


@dataclass(frozen=True)
class StepTables:
    """Per update t (rows, 0 .. steps - 1) and horizon x (columns, 1 .. length): the buffer
    means at the effective horizon x_eff = min(x, t + 1) (``sigma_bar2``, ``worth_bar``,
    ``k0_bar``, ``buffer`` = k0_bar / x_eff + S_k, ``x_eff``), and on-policy's V_on(t)."""

    sigma_bar2: np.ndarray
    worth_bar: np.ndarray
    k0_bar: np.ndarray
    buffer: np.ndarray
    x_eff: np.ndarray
    v_on: np.ndarray
    rho: float


def step_tables(phased: PhasedTerms, steps: int) -> StepTables:
    """The buffer means of every update of a run of ``steps`` >= 1 updates (``StepTables``):
    each rollout s steps stale at update t takes the terms of its birth t - s (section 11.12)."""
    checks.integer("steps", steps, 1)
    n = phased.length
    lam = _birth_weights(phased.births, steps)                       # (steps, P)
    t = np.arange(steps)[:, None]
    s = np.arange(n)[None, :]
    born = t - s                                                     # (steps, n)
    valid = born >= 0
    lam_ts = lam[np.clip(born, 0, steps - 1)] * valid[..., None]     # (steps, n, P)
    g = phased.terms[0].group_size

    def mixed(name):
        table = np.stack([np.asarray(getattr(tm, name), float) for tm in phased.terms], -1)
        return np.einsum("tsp,sp->ts", lam_ts, table)

    k = np.stack([tm.corr + (g - 1) * tm.corr_mate for tm in phased.terms], -1)
    k[0] = 0.0  # the same step is the k0 term
    means = staleness_means(mixed("sigma2"), mixed("worth"), mixed("within"),
                            np.einsum("tsp,sp->ts", lam_ts, k), g)
    x_eff = np.minimum(np.arange(1, n + 1)[None, :], t + 1)
    pick = x_eff - 1
    rows = np.arange(steps)[:, None]
    on = lam @ np.array([[tm.sigma2[0] / tm.worth[0] ** 2 * (1 + (g - 1) * tm.within[0])]
                         for tm in phased.terms])
    return StepTables(sigma_bar2=means["sigma_bar2"][rows, pick],
                      worth_bar=means["worth_bar"][rows, pick],
                      k0_bar=means["k0"][rows, pick], buffer=means["buffer"][rows, pick],
                      x_eff=x_eff.astype(float), v_on=on[:, 0],
                      rho=phased.terms[0].rho)


def update_variance(tab: StepTables, replay_ratio: float, draws: str = "rollouts") -> np.ndarray:
    """V(x, y; t) of every (update, horizon) of ``tab`` at one replay ratio y > 0, in units
    of sigma^2 / B (section 11.12; ``draws`` as in ``horizon.objective``)."""
    y = checks.positive("replay_ratio", replay_ratio)
    checks.choice("draws", draws, DRAWS)
    # buffer = k0_bar / x_eff + S_k: the pair sum is what is left after the k0 term
    pair = tab.buffer - tab.k0_bar / tab.x_eff
    if draws == "rollouts":
        factor = 1 + y * (tab.buffer + tab.rho)
    else:
        factor = tab.k0_bar * (1 + y / tab.x_eff) + y * (pair + tab.rho)
    return tab.sigma_bar2 / tab.worth_bar ** 2 * factor


def _budget_updates(steps: int, mu: float, y: float, y_max: float) -> float:
    """n(y) = T (1 + mu / y_max) / (1 + mu / y): the updates the AUC's budget buys (8.3)."""
    return steps * (1 + mu / y_max) / (1 + mu / y)


def _weighted(rate: np.ndarray, n: float) -> np.ndarray:
    """sum_{t < n} (1 - t / n) rate[t] over the first axis (n > 0 updates, at most len)."""
    t = np.arange(min(math.ceil(n), rate.shape[0]), dtype=float)
    w = 1 - t / n
    return np.tensordot(w, rate[: len(t)], axes=(0, 0))


def on_policy_score(steps: int, *, mu: float, y_max: float) -> float:
    """S_on of section 11.12: on-policy training's score over a run of ``steps`` updates at
    cost ratio mu > 0 and budget replay ratio ``y_max`` >= 1."""
    checks.integer("steps", steps, 1)
    checks.positive("mu", mu)
    checks.real("y_max", y_max, 1.0, math.inf)
    n = _budget_updates(steps, mu, 1.0, y_max)
    return float(_weighted(np.ones(steps), n))


def objective(tab: StepTables, horizon, replay_ratio, *, mu: float, y_max: float,
              draws: str = "rollouts") -> np.ndarray:
    """J_T(x, y) = S_on / S(x, y) of section 11.12 at whole horizons 1 <= x <= the tables'
    length (steps) and replay ratios 0 < y <= y_max, elementwise; mu > 0; 1 = on-policy,
    lower is better."""
    steps = tab.v_on.shape[0]
    x, y = np.broadcast_arrays(np.asarray(horizon, float), np.asarray(replay_ratio, float))
    if np.any(x < 1) or np.any(x > tab.x_eff.shape[1]) or np.any(x != np.round(x)):
        raise ValueError(f"horizon must be a whole number of steps in [1, {tab.x_eff.shape[1]}]")
    if np.any(y <= 0) or np.any(y > y_max):
        raise ValueError(f"replay_ratio must be in (0, y_max = {y_max:g}]")
    s_on = on_policy_score(steps, mu=mu, y_max=y_max)
    out = np.empty(x.shape)
    for yv in np.unique(y):
        at = y == yv
        score = _weighted(tab.v_on[:, None] / update_variance(tab, float(yv), draws),
                          _budget_updates(steps, mu, float(yv), y_max))
        out[at] = s_on / score[x[at].astype(int) - 1]
    return out


def objective_at_cells(tab: StepTables, horizons, ratios, *, mu: float, y_max: float,
                       on_policy_cell: int | None = None) -> np.ndarray:
    """J_T (section 11.12) at grid cells (x whole in [1, the tables' length], 0 < y <= y_max),
    the on-policy cell (index, or None) scored as on-policy training: 1 by definition."""
    x = np.asarray(horizons, dtype=float)
    y = np.asarray(ratios, dtype=float)
    out = np.ones(x.shape)
    rest = np.ones(x.shape, bool)
    if on_policy_cell is not None:
        rest[on_policy_cell] = False
    out[rest] = objective(tab, x[rest], y[rest], mu=mu, y_max=y_max)
    return out


@dataclass(frozen=True)
class WindowDesign:
    """The finite-run optimum at one mu: x* (steps), y*, J_T there (on-policy = 1), the
    predicted gain 1 - J_T (the share of on-policy's score the design adds, negative when
    on-policy is better) and x* at the search's edge."""

    horizon: int
    replay_ratio: float
    objective: float
    gain: float
    at_limit: bool

    @property
    def on_policy_best(self) -> bool:
        """No buffer beats on-policy training over this run."""
        return self.objective >= 1

    def to_dict(self) -> dict:
        return {**self.__dict__, "on_policy_best": self.on_policy_best}


def optimal_design(tab: StepTables, *, mu: float, y_max: float, max_horizon: int | None = None,
                   draws: str = "rollouts") -> WindowDesign:
    """Minimise J_T over whole 1 <= x <= max_horizon (default the tables' length) and
    Y_MIN <= y <= min(x, y_max): a log grid in y, then Brent's method in y at the
    ``POLISHED`` horizons whose grid minima lead (section 11.12)."""
    checks.positive("mu", mu)
    width = tab.x_eff.shape[1]
    top = width if max_horizon is None else checks.integer("max_horizon", max_horizon, 1, width)
    ys = np.exp(np.linspace(math.log(Y_MIN), math.log(y_max), 61))
    x = np.arange(1, top + 1)
    j = np.full((top, len(ys)), np.inf)
    for k, yv in enumerate(ys):
        ok = x >= yv
        if ok.any():
            j[ok, k] = objective(tab, x[ok], yv, mu=mu, y_max=y_max, draws=draws)
    best = (np.inf, 0, 0.0)
    for i in np.argsort(j.min(1))[:POLISHED]:
        k = int(np.argmin(j[i]))
        hi = min(float(ys[min(k + 1, len(ys) - 1)]), float(x[i]), y_max)
        lo = min(float(ys[max(k - 1, 0)]), hi)
        res = minimize_scalar(lambda yv: float(objective(tab, x[i], yv, mu=mu, y_max=y_max,
                                                         draws=draws)),
                              bounds=(lo, hi), method="bounded")
        for jv, yv in ((res.fun, res.x), (j[i, k], ys[k])):
            if jv < best[0]:
                best = (float(jv), int(i), float(yv))
    j_best, i, y_best = best
    return WindowDesign(horizon=int(x[i]), replay_ratio=y_best, objective=j_best,
                        gain=1 - j_best, at_limit=bool(x[i] == top))


def single_phase(terms: HorizonTerms) -> PhasedTerms:
    """One phase: the terms of panels born at step 0 held for the whole run (fill-up and
    AUC weighting without the phase, section 11.12's ablation)."""
    return PhasedTerms(births=(0.0,), terms=(terms,))


def registered_window(model: dict, length: int) -> tuple:
    """(phased terms, the pooled fit as one phase) of a window registration's
    ``horizon_model`` record (``llm_experiments.study.window_predict``): its phases'
    {"birth", "fit"} and pooled ``panel_fit``, with the terms it used and its measure of a
    stale rollout's worth (``window.worth``, "kept" when absent); ``length`` staleness values
    tabulated (horizons up to it)."""
    used = used_terms(model)
    phases = model["window"]["phases"]
    worth = model["window"].get("worth", "kept")
    phased = PhasedTerms(births=tuple(float(p["birth"]) for p in phases),
                         terms=tuple(model_terms(PanelFit.from_dict(p["fit"]), used, length,
                                                 worth) for p in phases))
    return phased, single_phase(model_terms(PanelFit.from_dict(model["panel_fit"]), used,
                                            length, worth))
