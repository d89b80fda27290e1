"""``optimal_config``: turn costs and a noise model into a concrete replay configuration.

The objective J(x, y) of section 5 (or 10) is minimised over integer configurations and, given
a number of GPUs, over every split of W inference workers and T trainers (theory.md sections 3,
5 and 5.9; the search is ``integer_search``); the continuous optimum (x*, y*) of
``design.optimal_design`` is reported next to it as ``design``:

* synchronous (``gpus=None``): integer rollouts per step R, buffer size N and batch B, with
  x = N/R and y = B/R;
* asynchronous (``gpus=G``): the split sets the replay ratio, y = mu T / W (section 3), R is
  the average number of new rollouts per trainer step (B/y), N is a multiple of T (one shard
  of N/T rollouts per trainer), B is divisible by T.

Every feasible configuration (N >= B, x within the horizon limit), on-policy training (N = B,
each rollout used once) included, is scored by the exact objective J(x, y) and the smallest
wins. Unless told ``horizon_source="model"``, a replay answer then keeps the horizon measured
on this project's settings (``MEASURED_HORIZON``), not the model's: section 10.11. The predicted compute saving against on-policy
training at equal bound is 1 - J/J(1, 1) = 1 - gamma * V/V_on (gamma the compute ratio,
V/V_on the variance ratio per update).

A measured noise table (``TabulatedNoise``) bounds the horizons searched: x = N/R stays within
the measured staleness (section 4) unless the table was built with ``extrapolate="hold_last"``,
as ``optimal_design`` does; the recommendation records the bound and its explanation says it.

The objective is the reuse-aware one of section 10 (``reuse.objective``) with the
self-correlation c of one rollout's uses at ``DEFAULT_REUSE`` unless told otherwise: section
10.11 says why (the variant beat section 5's model on both held-out settings);
``reuse=None`` gives section 5's model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from . import checks
from .advice import Advice, advise
from .model.compute import mu_from_costs
from .model.design import ON_POLICY, REPLAY, Design, objective, optimal_design
from .integer_search import (RowMinima, Rows, async_rows, at_horizon, minimise_rows,
                             nearest_horizon, sync_rows)
from .model.noise import NoiseModel, PowerLawNoise, TabulatedNoise
from .model.reuse import ConstantReuse, TabulatedReuse, _check_contribution, variant_name
from .model.reuse import objective as reuse_objective
from .model.reuse import optimal_design as reuse_optimal_design

# c of section 10.2, fitted from the probes of our three settings: 0.671 [0.614, 0.712]
# (cpu_tiny), 0.622 [0.556, 0.686] (heldout_digits3), 0.769 [0.719, 0.809] (heldout_wide);
# the default is their median, for users who have not measured their own (section 10.11).
DEFAULT_REUSE = ConstantReuse(0.67)

# The horizon measured, not modelled (sections 10.11, 11.8, 11.10, 11.12): the best grid
# horizon of the primary measure (AUC) at each judged mu of the registered grids below, with a
# bracketed optimum: tiny Qwen2 models from the pinned 0.26 policy on 2-digit addition, GRPO.
# A window is a grid scored over its first T updates (results/windows): with no learning-rate
# schedule a run's first T updates are a run of T updates. The best horizon grows with the
# length of the run: on cpu_sweep_v3's runs (10 seeds, x in {4, 16, 64, 256}) 4 over 50
# updates, 16 over 100, 16-64 over 150-200 and 64 over 300; in the 100-update grids (x a x2
# ladder, 5 seeds) 2-16 over 30-100 updates. No horizon model predicts it within a factor 2
# in most cases (11.10-11.12).
@dataclass(frozen=True)
class MeasuredHorizon:
    """The best horizon of one judged grid or window (updates), per judged mu; ``source``:
    its verdict under ``results/`` (a folder holding ``validation.json``)."""

    source: str
    run_updates: int  # trainer updates scored (the run, or the window)
    group_size: int  # rollouts per prompt, G
    best: tuple[float, ...]  # best grid horizon at each judged mu (measured, 2, 6.84)


MEASURED_HORIZONS = (
    MeasuredHorizon("cpu_sweep_v3", 300, 8, (64.0, 64.0, 64.0)),
    MeasuredHorizon("windows/cpu_sweep_v3_T200", 200, 8, (64.0, 64.0, 16.0)),
    MeasuredHorizon("windows/cpu_sweep_v3_T150", 150, 8, (64.0, 16.0, 16.0)),
    MeasuredHorizon("windows/cpu_sweep_v3_T100", 100, 8, (16.0, 16.0, 16.0)),
    MeasuredHorizon("windows/cpu_sweep_v3_T50", 50, 8, (4.0, 4.0, 4.0)),
    MeasuredHorizon("horizon_short", 100, 8, (8.0, 8.0, 16.0)),
    MeasuredHorizon("windows/horizon_short_T50", 50, 8, (8.0, 2.0, 16.0)),
    MeasuredHorizon("windows/horizon_short_T30", 30, 8, (2.0, 2.0, 4.0)),
    MeasuredHorizon("horizon_lr2", 100, 8, (8.0, 8.0, 8.0)),
    MeasuredHorizon("windows/horizon_lr2_T50", 50, 8, (8.0, 8.0, 16.0)),
    MeasuredHorizon("windows/horizon_lr2_T30", 30, 8, (8.0, 16.0, 16.0)),
    MeasuredHorizon("horizon_g4", 100, 4, (8.0, 8.0, 4.0)),
    MeasuredHorizon("windows/horizon_g4_T50", 50, 4, (8.0, 4.0, 4.0)),
    MeasuredHorizon("windows/horizon_g4_T30", 30, 4, (8.0, 4.0, 4.0)),
)
# Without run_updates the calculator keeps the horizon of the longest runs measured, G = 8.
MEASURED_HORIZON = 64.0  # trainer updates
# The rule below reads the grids of this group size: the one measured at every run length.
MEASURED_GROUP_SIZE = 8


def measured_curve() -> tuple[np.ndarray, np.ndarray]:
    """(run lengths T, the median best horizon over every G = ``MEASURED_GROUP_SIZE`` grid and
    mu measured at T), T increasing: 30 -> 6, 50 -> 8, 100 -> 8, 150 -> 16, 200 -> 64,
    300 -> 64 updates (section 11.12)."""
    grids = [m for m in MEASURED_HORIZONS if m.group_size == MEASURED_GROUP_SIZE]
    lengths = np.array(sorted({m.run_updates for m in grids}), dtype=float)
    best = np.array([np.median([b for m in grids if m.run_updates == t for b in m.best])
                     for t in lengths])
    return lengths, best


def measured_horizon(run_updates: int | None) -> float:
    """The measured best horizon for a run of ``run_updates`` trainer updates (>= 1, or None).

    None: ``MEASURED_HORIZON`` (64 updates). Otherwise ``measured_curve`` interpolated
    linearly in log T and log x between the measured run lengths (30-300 updates) and, outside
    them, the share of the run measured at the nearest end (20% of 30, 21% of 300), at least
    1 (sections 10.11, 11.12). An empirical curve from one task and model, not a model: say so
    to whoever uses it.
    """
    if run_updates is None:
        return MEASURED_HORIZON
    checks.integer("run_updates", run_updates, 1)
    lengths, best = measured_curve()
    if run_updates <= lengths[0]:
        return max(1.0, best[0] / lengths[0] * run_updates)
    if run_updates >= lengths[-1]:
        return best[-1] / lengths[-1] * run_updates
    return float(np.exp(np.interp(np.log(run_updates), np.log(lengths), np.log(best))))


# Whether any horizon model (section 5, 10 or later) has predicted measured optima: not yet.
HORIZON_MODEL_VALIDATED = False
# evidence: x and y of ``advice.advise`` (section 13); measured: x = MEASURED_HORIZON, y the
# model's; run_length: x from the measured run-length curve (``measured_horizon``), which did
# not transfer to a setting outside the repository (unvalidated); model: the model's own.
HORIZON_EVIDENCE, HORIZON_MEASURED = "evidence", "measured"
HORIZON_RUN_LENGTH, HORIZON_MODEL = "run_length", "model"
HORIZON_SOURCES = (HORIZON_EVIDENCE, HORIZON_MEASURED, HORIZON_RUN_LENGTH, HORIZON_MODEL)


@dataclass(frozen=True)
class ReplayRecommendation:
    """A concrete replay configuration (N, B, R and a W/T split) and its predicted effect.

    Attributes:
        buffer_size: N, rollouts kept (FIFO). batch_size: B, rollouts per update.
        rollouts_per_step: R, new rollouts per update (an average in the asynchronous case).
        workers, trainers: W and T (None for a synchronous design without a GPU count).
        horizon: x = N/R, staleness horizon in steps. replay_ratio: y = B/R, average uses.
        compute_ratio: gamma, cost per update over an on-policy update, (1 + W/T)/(1 + mu) or
            (1 + mu/y)/(1 + mu) synchronously; 1 for on-policy training (section 3).
        variance_ratio: gradient variance per update over on-policy's (model prediction).
        predicted_saving: 1 - J/J(1, 1): predicted share of compute saved against on-policy
            training to reach the same convergence bound (negative: more compute; section 5).
        regime: "on-policy" or "replay". mu, rho: the inputs (mu > 0, rho in [0, 1]).
        steps: updates the budget affords (None without a budget).
        horizon_limit: the longest horizon x searched, in steps: ``max_horizon``, or the noise
            table's ``measured_horizon`` when that is shorter and the table is not
            extrapolated.
        measured_horizon: longest horizon (steps) the noise measurements cover (largest
            measured staleness + 1); None for a parametric noise model.
        variant: the objective's model, "standard" (section 5) or one of
            ``reuse.VARIANTS`` (section 10). explanation: a short human summary. design: the
            continuous optimum (``design.Design``; its ``variant`` is this one's).
        notes: caveats.
        at_nb_edge: a replay answer with N = B (the smallest buffer a batch can be drawn
            from; x = y).
        horizon_capped: the horizon limit (``max_horizon`` or a table's measured range), not
            the objective or the measurement, set the horizon.
        extrapolated: the horizon lies past a noise table's measured range (``hold_last``).
        design_feasible: whether ``design``'s continuous (x*, y*) is a replay point of the
            feasible set (y* <= x*, i.e. N >= B, and x* within the horizon limit); when not,
            a note says it is the unconstrained optimum.
        horizon_source: one of ``HORIZON_SOURCES``: "evidence" (x and y from
            ``advice.advise``, section 13), "measured" (x is ``MEASURED_HORIZON``, section
            10.11), "run_length" (x from the measured run-length curve, unvalidated) or
            "model" (the model's own horizon; always for the model's on-policy answers).
        advice: the ``advice.Advice`` behind an "evidence" answer (loss, band, regrets,
            measured gain over on-policy, provenance), else None.
        horizon_validated: whether the horizon model behind the answer has been validated
            (``HORIZON_MODEL_VALIDATED``: False so far).
        model_horizon: x of the model's own best integer configuration (1 if on-policy),
            reported next to a measured horizon.
    """

    buffer_size: int
    batch_size: int
    rollouts_per_step: float
    workers: int | None
    trainers: int | None
    horizon: float
    replay_ratio: float
    compute_ratio: float
    variance_ratio: float
    predicted_saving: float
    regime: str
    mu: float
    rho: float
    steps: float | None
    horizon_limit: float
    measured_horizon: float | None
    variant: str
    explanation: str
    design: Design
    notes: tuple[str, ...] = field(default=())
    at_nb_edge: bool = False
    horizon_capped: bool = False
    extrapolated: bool = False
    design_feasible: bool = True
    horizon_source: str = HORIZON_MODEL
    horizon_validated: bool = HORIZON_MODEL_VALIDATED
    model_horizon: float | None = None
    advice: Advice | None = None

    @property
    def on_policy(self) -> bool:
        return self.regime == ON_POLICY

    @property
    def horizon_at_limit(self) -> bool:
        """True when the continuous optimum x* sits at ``horizon_limit``: the objective was
        still falling there, so x* is a lower bound on the best horizon, not an optimum."""
        return (math.isfinite(self.horizon_limit) and self.design.regime == REPLAY
                and self.design.horizon >= self.horizon_limit * (1 - 1e-9))

    def to_dict(self) -> dict:
        d = {k: val for k, val in self.__dict__.items()
             if k not in ("design", "notes", "advice")}
        d["advice"] = None if self.advice is None else self.advice.to_dict()
        d["horizon_at_limit"] = self.horizon_at_limit
        d["notes"] = list(self.notes)
        d["design"] = self.design.to_dict()
        return d


@dataclass(frozen=True)
class _Request:
    """The checked arguments of ``optimal_config``."""

    mu: float
    rho: float
    noise: NoiseModel
    batches: list[int]
    gpus: int | None
    trainers: int | None
    divisible_by_trainers: bool
    budget: float | None
    min_steps: int | None
    buffer_cap: float  # max_buffer_size, inf if none
    max_buffer_size: int | None
    max_horizon: float
    reuse: ConstantReuse | TabulatedReuse | None = None
    contribution: object = None  # reuse.ExpContribution or None
    horizon_source: str = HORIZON_MODEL  # one of HORIZON_SOURCES
    run_updates: int | None = None  # updates of the run (>= 1), None if not given

    @property
    def standard(self) -> bool:
        """No section 10 term: section 5's objective."""
        return self.reuse is None and self.contribution is None

    @property
    def table_limit(self) -> float:
        """Longest horizon the noise model allows a design to use (inf: no limit)."""
        return float(getattr(self.noise, "max_horizon", math.inf))

    @property
    def horizon_limit(self) -> float:
        """Longest horizon searched (steps): ``max_horizon`` within the table's limit."""
        return min(self.max_horizon, self.table_limit)

    def steps_for(self, cost_per_update: float) -> float | None:
        """Updates the budget affords at this cost (trainer-update units), None if no budget."""
        return None if self.budget is None else self.budget / cost_per_update


@dataclass(frozen=True)
class _Candidate:
    """One integer replay configuration and its score J(N/R, B/R) (sections 5 and 10)."""

    objective: float
    buffer_size: int
    batch_size: int
    rollouts_per_step: float
    workers: int | None
    trainers: int | None
    cost: float  # compute per update in trainer-update units (section 3)
    at_top: bool  # N is the row's largest, set by the horizon limit

    @property
    def horizon(self) -> float:
        """x = N/R in steps."""
        return self.buffer_size / self.rollouts_per_step


def _batch_candidates(batch_size) -> list[int]:
    if isinstance(batch_size, (tuple, list)):
        if len(batch_size) != 2:
            raise ValueError(f"batch_size must be an integer >= 1 or a (min, max) pair, "
                             f"got {batch_size!r}")
        lo = checks.integer("batch_size[0]", batch_size[0], 1)
        hi = checks.integer("batch_size[1]", batch_size[1], lo)
        return list(range(lo, hi + 1))
    return [checks.integer("batch_size", batch_size, 1)]


def _resolve_mu(mu, generation_cost, train_cost) -> float:
    """mu from itself or from the two raw costs (section 3), checked > 0."""
    if mu is None:
        if generation_cost is None or train_cost is None:
            raise ValueError("give mu, or both generation_cost and train_cost")
        mu = mu_from_costs(generation_cost, train_cost)
    elif generation_cost is not None or train_cost is not None:
        raise ValueError("give either mu or (generation_cost, train_cost), not both")
    return checks.positive("mu", mu)


def _resolve_reuse(reuse):
    """A reuse model from itself or from a constant c in [0, 1]; c = 0 is section 5's model
    (section 10.3 reduces to it), returned as None."""
    if reuse is None or isinstance(reuse, (ConstantReuse, TabulatedReuse)):
        return reuse
    if isinstance(reuse, bool) or not isinstance(reuse, (int, float)):
        raise ValueError(f"reuse must be None, a correlation c in [0, 1], a ConstantReuse or "
                         f"a TabulatedReuse, got {type(reuse).__name__}")
    c = checks.unit_interval("reuse", reuse)
    return None if c == 0 else ConstantReuse(c)


def _resolve_noise(noise, alpha, tau) -> NoiseModel:
    if noise is None:
        if alpha is None:
            raise ValueError("give a noise model (noise=...) or the power-law alpha (>= 0)")
        return PowerLawNoise(alpha=alpha, tau=tau)
    if alpha is not None:
        raise ValueError("give either noise or alpha, not both")
    return noise


def _check_max_buffer(max_buffer_size, batches) -> int | None:
    if max_buffer_size is None:
        return None
    max_buffer_size = checks.integer("max_buffer_size", max_buffer_size, 1)
    if max_buffer_size < min(batches):
        raise ValueError(f"max_buffer_size must be >= batch_size ({min(batches)}): a batch "
                         f"is drawn from the buffer; got {max_buffer_size}")
    return max_buffer_size


def _check_split(gpus, trainers) -> tuple[int | None, int | None]:
    if gpus is not None:
        gpus = checks.integer("gpus", gpus, 2)
        if trainers is not None:
            trainers = checks.integer("trainers", trainers, 1, gpus - 1)
    elif trainers is not None:
        raise ValueError("trainers needs gpus (the GPU count to split)")
    return gpus, trainers


def _check_budget(budget, min_steps) -> tuple[float | None, int | None]:
    if min_steps is not None:
        min_steps = checks.integer("min_steps", min_steps, 1)
        if budget is None:
            raise ValueError("min_steps needs budget (total compute in trainer updates)")
    if budget is not None:
        budget = checks.positive("budget", budget)
    return budget, min_steps


def _score(req: _Request, average: str):
    """J(x, y), vectorised: section 5's, or section 10's with the request's reuse terms."""
    if req.standard:
        return lambda x, y: objective(x, y, mu=req.mu, rho=req.rho, noise=req.noise,
                                      average=average)
    return lambda x, y: reuse_objective(x, y, mu=req.mu, rho=req.rho, noise=req.noise,
                                        reuse=req.reuse, contribution=req.contribution,
                                        average=average)


def _rows(req: _Request, notes: list[str]) -> Rows:
    """The feasible replay configurations (section 5.9) within the budget's ``min_steps``."""
    if req.gpus is None:
        rows = sync_rows(req.batches, mu=req.mu, buffer_cap=req.buffer_cap,
                         horizon_limit=req.horizon_limit)
    else:
        rows = async_rows(req.batches, mu=req.mu, gpus=req.gpus, trainers=req.trainers,
                          divisible=req.divisible_by_trainers, buffer_cap=req.buffer_cap,
                          horizon_limit=req.horizon_limit)
    if not len(rows):
        where = (f"within the measured noise table ({req.table_limit:g} steps)"
                 if req.table_limit <= req.max_horizon else
                 f"within max_horizon = {req.max_horizon:g} steps")
        notes.append(f"no replay configuration under the constraints (N >= B) keeps the "
                     f"horizon N/R {where}")
    elif req.min_steps is not None:
        rows = rows.where(req.budget / rows.cost >= req.min_steps)
        if not len(rows):
            raise ValueError(f"no replay configuration affords min_steps = {req.min_steps} "
                             f"updates with budget = {req.budget:g}")
    return rows


def _lower_bound(req: _Request, rows: Rows, average: str) -> np.ndarray | None:
    """A lower bound on J over each row, or None where none is known (section 5.9):
    sigma_bar^2(lo/R) (1 + y/mu) (1/y + rho + R/hi). It holds when sigma^2 is non-decreasing
    (A3: sigma_bar^2 then too, so lo/R is its smallest x in the row) because f_bar <= 1,
    S(x) >= 0 and 1/x >= R/hi."""
    if not req.noise.satisfies_a3:
        return None
    y = rows.replay_ratio
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        low = req.noise.sigma_bar2(rows.lo / rows.rollouts, average) * (1 + y / req.mu) \
            * (1 / y + req.rho + rows.rollouts / rows.hi)
    # Rounding must not prune a row whose minimum equals its bound.
    return np.where(np.isfinite(low), low * (1 - 1e-9), -np.inf)


def _candidate(rows: Rows, minima: RowMinima) -> _Candidate | None:
    """The row minimum with the lowest objective as a ``_Candidate`` (None if none)."""
    if not len(rows) or not np.isfinite(minima.objective).any():
        return None
    i = int(np.argmin(minima.objective))
    n = int(minima.buffer_size[i])
    split = rows.workers is not None
    return _Candidate(objective=float(minima.objective[i]), buffer_size=n,
                      batch_size=int(rows.batch[i]), rollouts_per_step=float(rows.rollouts[i]),
                      workers=int(rows.workers[i]) if split else None,
                      trainers=int(rows.trainers[i]) if split else None,
                      cost=float(rows.cost[i]),
                      at_top=bool(rows.horizon_bound[i] and n + rows.step[i] > rows.hi[i]))


def _measured_target(req: _Request) -> float:
    """The measured best horizon for this request (updates): ``MEASURED_HORIZON``, or with
    "run_length" ``measured_horizon(run_updates)``; within the horizon limit."""
    run = req.run_updates if req.horizon_source == HORIZON_RUN_LENGTH else None
    return min(measured_horizon(run), req.horizon_limit)


def _nearest_ratio(rows: Rows, replay_ratio: float) -> Rows:
    """The rows whose y = B/R is nearest ``replay_ratio`` in log scale."""
    d = np.abs(np.log(rows.replay_ratio / replay_ratio))
    return rows.where(d <= d.min() + 1e-9)


def _at_measured(req: _Request, rows: Rows, score, notes: list[str],
                 target: float | None = None) -> _Candidate:
    """The best configuration at the measured horizon (``target``, default
    ``_measured_target``): in each row the buffer sizes next to x R, the model's J choosing
    among rows; if no row reaches that horizon, the rows nearest it in log x, the model's J
    choosing among those."""
    target = _measured_target(req) if target is None else min(target, req.horizon_limit)
    best = _candidate(rows, at_horizon(score, rows, target))
    if best is not None:
        return best
    near = nearest_horizon(rows, target)
    closest = near.objective <= near.objective.min() + 1e-12
    rows = rows.where(closest)
    n = near.buffer_size[closest]
    vals = score(n / rows.rollouts, rows.replay_ratio)
    best = _candidate(rows, RowMinima(buffer_size=n, objective=np.asarray(vals, float)))
    notes.append(f"no configuration under the constraints (N >= B, max_buffer_size) reaches "
                 f"the measured horizon x = {target:g} updates; the nearest is "
                 f"x = {best.horizon:.3g}")
    return best


def _on_policy_split(req: _Request) -> tuple[int, int | None, int | None]:
    """(B, W, T) without a buffer: the split with W/T closest to mu (section 3)."""
    b = req.batches[0]
    if req.gpus is None:
        return b, None, None
    options = [req.trainers] if req.trainers is not None else range(1, req.gpus)
    t = min((tt for tt in options
             if not req.divisible_by_trainers or any(bb % tt == 0 for bb in req.batches)),
            key=lambda tt: abs((req.gpus - tt) / tt - req.mu), default=None)
    if t is None:
        raise ValueError("no split has a batch_size divisible by its trainer count")
    if req.divisible_by_trainers:
        b = next(bb for bb in req.batches if bb % t == 0)
    return b, req.gpus - t, t


def _recommendation(req: _Request, design: Design, notes: list[str],
                    **outcome) -> ReplayRecommendation:
    """A ``ReplayRecommendation`` from its regime-dependent fields (``outcome``) and the
    request's; the explanation is filled in by ``optimal_config``."""
    measured = req.noise.measured_horizon if isinstance(req.noise, TabulatedNoise) else None
    feasible = (design.regime == REPLAY and design.replay_ratio <= design.horizon
                <= req.horizon_limit)
    if design.regime == REPLAY and not feasible:
        notes.append(f"design is the unconstrained continuous optimum (x* = "
                     f"{design.horizon:.4g}, y* = {design.replay_ratio:.4g}), outside the "
                     f"feasible set (N >= B, i.e. y <= x, and x <= {req.horizon_limit:g}); the "
                     f"configuration is the best feasible one")
    return ReplayRecommendation(**outcome, mu=req.mu, rho=req.rho,
                                horizon_limit=req.horizon_limit, measured_horizon=measured,
                                variant=variant_name(req.reuse, req.contribution),
                                explanation="", design=design, notes=tuple(notes),
                                design_feasible=feasible)


def _on_policy(req: _Request, design: Design, notes: list[str],
               by_model: bool = True) -> ReplayRecommendation:
    """The on-policy answer: N = B = R, every rollout used once, no buffer (``by_model``:
    the model's choice, else the evidence's)."""
    b, w, t = _on_policy_split(req)
    if by_model and design.regime == REPLAY:
        notes.append("no integer configuration under the constraints beats on-policy "
                     "training, although the continuous optimum is a replay design")
    return _recommendation(req, design, notes, buffer_size=b, batch_size=b,
                           rollouts_per_step=float(b), workers=w, trainers=t, horizon=1.0,
                           replay_ratio=1.0, compute_ratio=1.0, variance_ratio=1.0,
                           predicted_saving=0.0, regime=ON_POLICY,
                           steps=req.steps_for(1 + req.mu), model_horizon=1.0)


def _capped(req: _Request, best: _Candidate, source: str, target: float | None) -> bool:
    """Whether the horizon limit, not the objective, set the horizon: the measured or
    advised horizon ``target`` past the limit, or the model's optimum at the largest N the
    limit allows."""
    if target is not None:
        return target > req.horizon_limit
    return best.at_top


def _replay(req: _Request, design: Design, best: _Candidate, notes: list[str], *,
            source: str, model_horizon: float, target: float | None = None,
            advice: Advice | None = None) -> ReplayRecommendation:
    """A replay answer; gamma = cost / (1 + mu) (section 3), 1 - J/J(1, 1)
    the saving (section 5). ``target``: the measured or advised horizon, None for the
    model's."""
    j_ratio = best.objective / design.on_policy_objective
    x = best.horizon
    gamma = best.cost / (1 + req.mu)
    steps = req.steps_for(best.cost)
    capped = _capped(req, best, source, target)
    if capped:
        where = (f"max_horizon = {req.max_horizon:g}" if req.max_horizon <= req.table_limit
                 else f"the noise table's measured range, {req.table_limit:g}")
        notes.append(f"horizon capped at {where} steps")
    if req.max_buffer_size is not None and best.buffer_size == req.max_buffer_size:
        notes.append("buffer size capped at max_buffer_size")
    if steps is not None and x > steps / 10:
        notes.append("the horizon is not small against the number of updates: the "
                     "asymptotic design is only indicative")
    table = req.noise if isinstance(req.noise, TabulatedNoise) else None
    return _recommendation(req, design, notes, buffer_size=best.buffer_size,
                           batch_size=best.batch_size, rollouts_per_step=best.rollouts_per_step,
                           workers=best.workers, trainers=best.trainers, horizon=x,
                           replay_ratio=best.batch_size / best.rollouts_per_step,
                           compute_ratio=gamma, variance_ratio=j_ratio / gamma,
                           predicted_saving=1 - j_ratio, regime=REPLAY, steps=steps,
                           at_nb_edge=bool(best.buffer_size == best.batch_size),
                           horizon_capped=capped,
                           extrapolated=table is not None and x > table.measured_horizon,
                           horizon_source=source, model_horizon=model_horizon, advice=advice)


def _from_evidence(req: _Request, design: Design, rows: Rows, score, notes: list[str],
                   model_best: _Candidate | None) -> ReplayRecommendation:
    """The "evidence" answer: on-policy when the advice is, else the integers at the
    advised x among the rows nearest the advised y, the model's J choosing among them."""
    advice = advise(req.mu, req.run_updates)
    model_x = 1.0 if model_best is None else model_best.horizon
    if advice.on_policy or not len(rows):
        rec = _on_policy(req, design, notes, by_model=False)
        return replace(rec, horizon_source=HORIZON_EVIDENCE, advice=advice)
    best = _at_measured(req, _nearest_ratio(rows, advice.replay_ratio), score, notes,
                        target=advice.horizon)
    return _replay(req, design, best, notes, source=HORIZON_EVIDENCE, model_horizon=model_x,
                   target=advice.horizon, advice=advice)


def optimal_config(mu: float | None = None, rho: float = 0.1, noise: NoiseModel | None = None,
                   *, alpha: float | None = None, tau: float = 1.0,
                   generation_cost: float | None = None, train_cost: float | None = None,
                   gpus: int | None = None, trainers: int | None = None, batch_size=60,
                   divisible_by_trainers: bool = True, budget: float | None = None,
                   min_steps: int | None = None, max_buffer_size: int | None = None,
                   max_horizon: float = 1000.0, average: str | None = None,
                   reuse=DEFAULT_REUSE, contribution=None,
                   horizon_source: str = HORIZON_EVIDENCE,
                   run_updates: int | None = None) -> ReplayRecommendation:
    """The replay configuration the theory recommends for your costs and noise (sections 5,
    5.9 and 10).

    Every feasible integer configuration is searched (``integer_search``: each batch B and
    R = 1..10B, or each worker/trainer split; N >= B, N/R within the horizon limit) and
    on-policy training competes with them.

    Args:
        mu: generation cost of one batch over one trainer update, in (0, inf); or give
            ``generation_cost`` and ``train_cost`` (same unit, each > 0) instead.
        rho: coupling coefficient of buffer samples, in [0, 1].
        noise: a staleness-noise model; or give ``alpha`` >= 0 (and ``tau`` > 0) for the power
            law sigma(s) = (s/tau)^alpha. A ``TabulatedNoise`` keeps the horizon within its
            measured range unless built with ``extrapolate="hold_last"``.
        gpus: GPUs to split into workers and trainers (integer >= 2), or None for the
            synchronous design (integer R new rollouts per step).
        trainers: fix T (1 <= T < gpus) instead of searching every split.
        batch_size: B (integer >= 1) or an inclusive (min, max) range to search.
        divisible_by_trainers: require B and N to be multiples of T (sharded buffer).
        budget: total compute in trainer-update units (> 0), with ``min_steps`` the fewest
            updates it must afford (integer >= 1); configurations below are excluded.
        max_buffer_size: largest N allowed (integer >= the smallest batch), e.g. memory.
        max_horizon: largest x = N/R considered, in steps (> 1); caps unbounded optima.
        average: sigma_bar^2 average ("discrete"/"continuous"), the model's default if None.
        reuse: the self-correlation of one rollout's noise at two uses (section 10.2): a
            constant c in [0, 1], a ``reuse.ConstantReuse`` or ``reuse.TabulatedReuse``, or
            None (or 0) for section 5's model, which treats every use as a fresh noise draw.
            The default, ``DEFAULT_REUSE`` (c = 0.67), is the median c measured on our three
            settings; measure yours (``calibrate``, ``llm_experiments predict``) when you can.
        contribution: a ``reuse.ExpContribution`` (section 10.4: the share of a stale or
            reused sample's gradient the clip keeps), or None (no default: its measured
            per-use constant changed sign between our settings, section 10.11).
        horizon_source: "evidence" (default): the advice of ``advice.advise`` (section 13)
            decides on-policy against replay and sets x and y, measured on this project's
            grids at the run length and mu nearest yours; the integers are the model's best
            there, and ``advice`` says what the evidence showed. "measured": the model
            decides replay against on-policy, x is ``MEASURED_HORIZON`` and the model
            chooses y. "run_length": as "measured" with x = ``measured_horizon(run_updates)``,
            the measured run-length curve (6 updates at 30, 8 at 100, 64 at 300), which did
            not transfer to a setting outside the repository: unvalidated. "model": the
            model's own horizon (``Calibration``'s default).
        run_updates: trainer updates the run will make (integer >= 1), or None; read by
            "evidence" (the run length matched) and "run_length".

    Returns:
        A frozen ``ReplayRecommendation``. On-policy (N = B, each rollout used once) is a
        first-class answer; its ``variant`` names the objective's model.
    Raises:
        ValueError: an argument outside its range (the message names it), or no
            configuration satisfies the constraints.
    """
    mu = _resolve_mu(mu, generation_cost, train_cost)
    rho = checks.unit_interval("rho", rho)
    noise = _resolve_noise(noise, alpha, tau)
    batches = _batch_candidates(batch_size)
    max_horizon = checks.real("max_horizon", max_horizon, 1.0, math.inf, lo_open=True)
    max_buffer_size = _check_max_buffer(max_buffer_size, batches)
    gpus, trainers = _check_split(gpus, trainers)
    budget, min_steps = _check_budget(budget, min_steps)
    req = _Request(mu=mu, rho=rho, noise=noise, batches=batches, gpus=gpus, trainers=trainers,
                   divisible_by_trainers=divisible_by_trainers, budget=budget,
                   min_steps=min_steps, max_buffer_size=max_buffer_size,
                   buffer_cap=math.inf if max_buffer_size is None else max_buffer_size,
                   max_horizon=max_horizon, reuse=_resolve_reuse(reuse),
                   contribution=_check_contribution(contribution),
                   horizon_source=checks.choice("horizon_source", horizon_source, HORIZON_SOURCES),
                   run_updates=None if run_updates is None
                   else checks.integer("run_updates", run_updates, 1))
    if req.standard:
        design = optimal_design(mu, rho, noise, average=average)
    else:
        design = reuse_optimal_design(mu, rho, noise, reuse=req.reuse,
                                      contribution=req.contribution, average=average)
    notes = list(design.notes)
    score = _score(req, design.average)
    rows = _rows(req, notes)
    model_best = _candidate(rows, minimise_rows(
        score, rows, _lower_bound(req, rows, design.average),
        incumbent=design.on_policy_objective)) if len(rows) else None
    if req.horizon_source == HORIZON_EVIDENCE:
        rec = _from_evidence(req, design, rows, score, notes, model_best)
    elif model_best is None or model_best.objective >= design.on_policy_objective:
        rec = _on_policy(req, design, notes)
    elif req.horizon_source != HORIZON_MODEL and model_best.horizon > 1 + 1e-9:
        # x = 1 keeps no stale rollout (R >= B fresh ones a step): the model's on-policy
        # regime (section 5.7), which no measured horizon speaks against.
        rec = _replay(req, design, _at_measured(req, rows, score, notes), notes,
                      source=req.horizon_source, model_horizon=model_best.horizon,
                      target=_measured_target(req))
    else:
        rec = _replay(req, design, model_best, notes, source=HORIZON_MODEL,
                      model_horizon=model_best.horizon)
    return replace(rec, explanation=_explain(rec, req))


def _describe_noise(noise) -> str:
    d = noise.to_dict()
    if d["model"] == "power_law":
        return f"staleness noise sigma(s) = (s/{d['tau']:g})^{d['alpha']:g}"
    if d["model"] == "constant":
        return "staleness noise constant in staleness"
    return f"a measured noise table ({len(d['staleness'])} staleness values)"


def _explain_range(rec: ReplayRecommendation, noise) -> str:
    """How the horizon search treated the noise table's measured range (empty if no table)."""
    if not isinstance(noise, TabulatedNoise):
        return ""
    s_max = float(noise.staleness[-1])
    if noise.extrapolate == "none":
        bound = ""
        if rec.horizon_at_limit:
            # Measured on heldout_digits3 (theory.md section 10.9): every capped prediction
            # (x = 16) lost to x = 64, so the edge must read as a bound, not as an optimum.
            bound = (f" The optimum sits at that edge (the objective still falls there), so "
                     f"{rec.measured_horizon:g} steps is a lower bound on the best horizon: "
                     f"measure noise with a longer buffer before keeping a longer one.")
        return (f" The noise table covers staleness up to {s_max:g} steps, so horizons past "
                f"{rec.measured_horizon:g} steps were not considered (extrapolate='hold_last' "
                f"searches further, holding sigma^2 at its last measured value).{bound}")
    where = "beyond" if rec.horizon > rec.measured_horizon else "within"
    return (f" Past staleness {s_max:g} steps the noise table is extrapolated by holding "
            f"sigma^2 at its last measured value ({float(noise.sigma2_values[-1]):.3g}); the "
            f"recommended horizon of {rec.horizon:.3g} steps is {where} the measured range.")


def _describe_model(req: _Request) -> str:
    """Which objective scored the candidates, and where its constants came from."""
    if req.standard:
        return (f" Model: section 5's, every use of a rollout a fresh noise draw (reuse=None; "
                f"the default c = {DEFAULT_REUSE.c:g} of section 10 predicted our held-out "
                f"optima better).")
    terms = []
    if req.reuse is not None:
        c = req.reuse.to_dict()
        c_text = f"c = {c['c']:.3g}" if "c" in c else "a measured c(g) table"
        source = (" (the default: the median measured on our three settings; measure yours)"
                  if req.reuse == DEFAULT_REUSE else "")
        terms.append(f"one rollout's uses self-correlated, {c_text}{source}")
    if req.contribution is not None:
        f = req.contribution
        terms.append(f"a sample used u times before at staleness s keeps exp(-{f.per_use:.3g} u"
                     f" - {f.per_step:.3g} s) of its gradient")
    return (f" Model: {variant_name(req.reuse, req.contribution)} (section 10): "
            f"{'; '.join(terms)}.")


def _explain(rec: ReplayRecommendation, req: _Request) -> str:
    noise, gpus = req.noise, req.gpus
    head = (f"Generating a batch costs mu = {rec.mu:.3g} trainer updates; "
            f"{_describe_noise(noise)}, coupling rho = {rec.rho:g}.{_describe_model(req)}")
    split = ""
    if rec.workers is not None:
        split = (f" Split the {gpus} GPUs into {rec.workers} worker{'s' * (rec.workers > 1)} "
                 f"and {rec.trainers} trainer{'s' * (rec.trainers > 1)}.")
    if rec.on_policy:
        return (f"{head} Stay on-policy: no buffer (N = B = {rec.batch_size}), each rollout "
                f"used once.{split} The model predicts no compute saving from replay here."
                f"{_explain_range(rec, noise)}{_explain_horizon(rec, req)}")
    saving = rec.predicted_saving
    verdict = (f"predicted compute to reach the same loss bound: {100 * saving:.0f}% less "
               f"than on-policy" if saving >= 0 else
               f"predicted {100 * -saving:.0f}% more compute than on-policy")
    if rec.advice is not None and rec.advice.gain is not None:
        g = rec.advice.gain
        verdict = (f"measured: {g.mean:+.3f} AUC against on-policy at equal compute "
                   f"(from {g.low:+.3f} to {g.high:+.3f} over {len(rec.advice.evidence)} "
                   f"settings; the model's own figure at these integers, {verdict}, comes "
                   f"from the horizon term the measurements contradict)")
    return (f"{head} Keep a FIFO buffer of the last {rec.buffer_size} rollouts "
            f"({rec.horizon:.3g} steps of generation) and train on batches of {rec.batch_size} "
            f"with {rec.rollouts_per_step:.3g} new rollouts per step, so each rollout is used "
            f"about {rec.replay_ratio:.3g} times.{split} An update costs "
            f"{rec.compute_ratio:.2f} of an on-policy update and is {rec.variance_ratio:.2f}x "
            f"as noisy; {verdict}.{_explain_range(rec, noise)}{_explain_horizon(rec, req)}")


_MEASUREMENT = ("the best horizon measured on this project's registered grids grows with the "
                "run: 64 updates in runs of 300 (21%), 8-16 in runs of 100 with groups of 8 "
                "and 4-8 with groups of 4 (2-digit addition, tiny models, GRPO; theory.md "
                "8.10, 11.8, 11.10)")


def _explain_horizon(rec: ReplayRecommendation, req: _Request) -> str:
    """Where the horizon came from and what was measured (sections 10.11, 13)."""
    if rec.horizon_source == HORIZON_EVIDENCE:
        return _explain_evidence(rec)
    if rec.on_policy:
        if req.horizon_source == HORIZON_MODEL:
            return ""
        return (f" The model's regime is kept; {_MEASUREMENT}, and on-policy training lost "
                f"0-13% of the best gain there.")
    model_x = (f"the model's own choice is x = {rec.model_horizon:.3g} (continuous optimum "
               f"x* = {rec.design.horizon:.3g})")
    if rec.horizon_source in (HORIZON_MEASURED, HORIZON_RUN_LENGTH):
        share = ("" if rec.horizon_source == HORIZON_MEASURED else
                 f" ({rec.horizon / req.run_updates:.0%} of run_updates = {req.run_updates}; "
                 f"the run-length curve is unvalidated: it did not transfer to a setting "
                 f"outside the repository)")
        # The model's saving at a horizon it would not choose is the part measurements
        # contradict: there a long buffer beat on-policy training (section 8.10).
        doubt = ("" if rec.predicted_saving >= 0 else
                 " The predicted saving above is the model's, whose horizon term is what the "
                 "measurements contradict: on those settings the best buffer beat on-policy "
                 "training, which lost 0-13% of the best gain (theory.md 8.10, 11.10).")
        return (f" The horizon is measured, not modelled: x = {rec.horizon:.3g} updates"
                f"{share}, because {_MEASUREMENT}, and no horizon model is validated; "
                f"{model_x}; y and the integers are the model's best at this horizon. "
                f"horizon_source='model' returns the model's horizon.{doubt}")
    return (f" The horizon is the model's and is not validated: {_MEASUREMENT}; "
            f"{model_x}.")


def _explain_evidence(rec: ReplayRecommendation) -> str:
    """What the advice behind an "evidence" answer measured (section 13)."""
    a = rec.advice
    if not a.evidence:
        return " No measured setting was left to advise from: the rule x = 64, y = sqrt(mu)."
    band = ", ".join(f"x = {b.horizon:g}, y = {b.replay_ratio:g}" for b in a.band)
    dom = ("it loses no more than the rule nor, where on-policy beats the rule, than "
           "on-policy, in every one" if a.dominates else
           "no cell loses no more than the rule (and on-policy where it beats the rule) in "
           "every one: it is the cell whose largest excess is least")
    return (f" The horizon and the replay ratio are measured, not modelled (section 13): "
            f"x = {a.horizon:g}, y = {a.replay_ratio:g} is the grid cell advised there (mean "
            f"regret {a.regret:.3f} of the best gain; the rule x = 64, y = sqrt(mu) {a.rule_regret:.3f}"
            f"{'' if a.on_policy_regret is None else f', on-policy {a.on_policy_regret:.3f}'}) "
            f"over {len(a.evidence)} settings measured at {a.run_updates} updates and mu "
            f"near {a.mu:.3g}; {dom}. Within {a.epsilon:g} of its mean regret: {band}. "
            f"Loss: {a.loss} ({a.provenance['loss']}).{_explain_adaptive(a.adaptive)}")


def _explain_adaptive(adaptive) -> str:
    """The adaptive buffer's line (section 13.2), empty where it does not apply."""
    if adaptive is None:
        return ""
    if adaptive.named:
        tokens = "" if adaptive.drop_tokens_below_p >= 1 else (
            f" over the tokens sampled below {adaptive.drop_tokens_below_p:g} "
            f"(drop_tokens_below_p)")
        return (f" Where the buffer can evict by staleness (the harness's buffer.drop_logr2, "
                f"ReplaySettings.drop_logr2 of ReplayGRPOTrainer): keep every rollout up to "
                f"{adaptive.horizon:g} updates old and drop those whose mean (log r)^2"
                f"{tokens} passes {adaptive.drop_logr2:g}; {adaptive.reason}.")
    return f" Adaptive buffer: {adaptive.reason}."


def design_grid(mus, alphas, rho: float, *, average: str | None = None) -> dict:
    """Optimal designs over a (mu, alpha) grid of power-law models (section 5).

    Args: mus, alphas: 1-d arrays (mu > 0, alpha >= 0); rho in [0, 1].
    Returns: dict of 2-d arrays (len(mus) x len(alphas)): "horizon", "replay_ratio",
    "predicted_saving", and "on_policy" (bool).
    """
    mus = checks.finite_array("mus", mus)
    alphas = checks.finite_array("alphas", alphas, nonnegative_values=True)
    out = {k: np.empty((mus.size, alphas.size)) for k in
           ("horizon", "replay_ratio", "predicted_saving")}
    out["on_policy"] = np.empty((mus.size, alphas.size), dtype=bool)
    for i, mu in enumerate(mus):
        for j, a in enumerate(alphas):
            d = optimal_design(float(mu), rho, PowerLawNoise(float(a)), average=average)
            out["horizon"][i, j] = d.horizon
            out["replay_ratio"][i, j] = d.replay_ratio
            out["predicted_saving"][i, j] = d.predicted_saving
            out["on_policy"][i, j] = d.regime == ON_POLICY
    return out
