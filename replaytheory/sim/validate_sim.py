"""The validation loop in simulation (theory.md sections 4-5, 8).

For each problem variant (the quadratic, where A1-A3 hold by construction, and the tabular
policy with the clipped ``grpo`` and the ``grpo_unclipped`` losses):

1. probe runs and the grid's minibatch probes measure per-sample noise, coupling and bias;
   ``calibrate_variant`` fits alpha, tau, rho, kappa with intervals and goodness of fit;
2. ``run_grid`` simulates a grid of buffer designs (x = N/R, y = B/R at a fixed batch B); for
   each mu the compute budget is C = T0 B (1 + mu) samples (T0 on-policy steps), every cell
   gets C / (B + mu R) steps, each at its best constant step size from a grid, and the cell
   with the lowest loss at the budget is the empirical best;
3. ``predict`` turns each design (``asymptotic``: section 5 with the fitted constants, through
   the calculator; ``finite_eta``: the Theorem's full bound at this budget;
   ``effective_coupling``: section 5 with the coupling the buffer realises, a named
   extension) into an integer (N, B, R); ``score`` simulates it up to ``regret_factor`` x C,
   and its regret is the extra compute it needs to reach the best cell's loss:
   C_needed / C - 1 (negative if it does better).

``run_validation`` writes the records of ``sim_records`` (one ``ScoreRecord`` per problem,
loss, mu and design in ``summary.json``; the grids, calibrations, probes and the Fig. 2
pipeline runs beside it). It draws no figures: ``python -m figures.sim_validation OUT_DIR``
reads the folder back with ``sim_records.load_validation``.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .. import checks
from ..fit.calibrate import Calibration, calibrate
from ..io import write_json
from .pipeline_sim import simulate_pipeline
from ..fit.probes import ProbeSet
from .replay_sim import simulate_replay
from ..model.reuse import STANDARD
from ..model.reuse import VARIANTS as REUSE_DESIGNS
from .sim_quadratic import QuadraticProblem
from .sim_records import (FiniteEtaDetail, FitSummary, GridResult, PipelineRun, Prediction,
                          ScoreRecord, ValidationResults, VariantResult, save_summary,
                          save_variant)
from .sim_tabular import TabularProblem

DESIGNS = ("asymptotic", "finite_eta", "effective_coupling")
NEAR_BEST = 0.02  # grid cells within this fraction of the best loss are listed as near-best
TABULAR_LOSSES = ("grpo", "grpo_unclipped")  # of sim_tabular.LOSSES: the clipped and the plain


@dataclass(frozen=True)
class ProbeRun:
    """A calibration run and the probe tables kept from it.

    Args:
        tables: table names to keep. cell: (N, B, R). steps, lr: the run. every: steps
        between probes. start: first probe step (None: when the buffer is full).
    """

    tables: tuple
    cell: tuple
    steps: int
    lr: float
    every: int
    start: int | None = None


@dataclass(frozen=True)
class VariantSpec:
    """One problem variant of the validation and its simulation settings.

    Args:
        problem: ``QuadraticProblem`` or ``TabularProblem``.
        batch_size: B, fixed across the grid (integer >= 1).
        rollouts: R values of the grid (y = B/R), multiples of the problem's group size.
        horizons: x values of the grid (N = round(x R); cells with N < B are skipped).
        onpolicy_steps: T0, steps the budget buys on-policy (x = y = 1).
        seeds: runs per (cell, lr). lrs: explicit step sizes, or None to scale them with the
            run length: eta = c / T for c in ``lr_scale`` (the quadratic's optimal constant
            step size is about log(F0/loss)/(2T)).
        lr_scale: (c_min, c_max, values per octave) for scaled step sizes.
        probe_runs: the calibration runs (``ProbeRun``). minibatch_every: minibatch probes
            in the grid runs (the decomposition test).
        smoothness, f0: L and F(theta_0) for the finite-eta design.
    """

    problem: object
    batch_size: int
    rollouts: tuple
    horizons: tuple
    onpolicy_steps: int
    seeds: int
    probe_runs: tuple
    minibatch_every: int
    smoothness: float
    f0: float
    lrs: tuple | None = None
    lr_scale: tuple = (1.0, 32.0, 3)

    @property
    def label(self) -> str:
        p = self.problem
        return p.name if isinstance(p, QuadraticProblem) else f"{p.name}-{p.loss}"

    @property
    def granularity(self) -> int:
        return getattr(self.problem, "group_size", 1)

    def budget(self, mu: float) -> float:
        """C = T0 B (1 + mu), in samples."""
        return self.onpolicy_steps * self.batch_size * (1 + mu)

    def lrs_for(self, t_lo: float, t_hi: float) -> np.ndarray:
        """Step sizes covering runs of t_lo to t_hi steps."""
        if self.lrs is not None:
            return np.asarray(self.lrs, dtype=float)
        c_lo, c_hi, per_octave = self.lr_scale
        lo, hi = math.log2(c_lo / t_hi), math.log2(c_hi / t_lo)
        return 2.0 ** np.arange(lo, hi + 1e-9, 1.0 / per_octave)


@dataclass(frozen=True)
class Settings:
    """Everything ``run_validation`` needs: mus, variants, the regret horizon, pipeline runs."""

    mus: tuple = (2.0, 6.84, 20.0)
    variants: tuple = ()
    regret_factor: float = 3.0
    pipeline_rollouts: int = 60_000
    seed: int = 0
    notes: tuple = field(default=())


def _quadratic_spec(t0, seeds, rollouts, horizons, b, probe_steps, probe_r=16):
    """The quadratic's calibration: noise and coupling from the stationary phase (after a
    burn-in, where the staleness bias, a component shared by all rollouts of one insertion
    step, is negligible against the noise), kappa from the transient (where drift is large)."""
    prob = QuadraticProblem(dim=16, alpha=0.2, tau=1.0, rho=0.1, kappa=0.5, f0=10.0,
                            reference_samples=64)
    cell = (int(max(horizons) * probe_r), b, probe_r)
    lr = 0.02
    burn_in = int(math.log(1e6) / lr)  # theta_0's share of the loss below 1e-6
    runs = (ProbeRun(("noise", "coupling", "reuse"), cell, burn_in + probe_steps, lr, 4,
                     burn_in),
            ProbeRun(("bias",), cell, int(2 / lr) + cell[0] // probe_r, lr, 1))
    return VariantSpec(problem=prob, batch_size=b, rollouts=rollouts, horizons=horizons,
                       onpolicy_steps=t0, seeds=seeds, probe_runs=runs,
                       minibatch_every=max(1, t0 // 20), smoothness=prob.smoothness,
                       f0=prob.f0)


def _tabular_spec(loss, t0, seeds, rollouts, horizons, b, lrs, probe_steps, probe_r=32):
    """The tabular problem's calibration: one run at the longest horizon of the grid and the
    middle step size, probed throughout (there is no stationary phase to wait for)."""
    prob = TabularProblem(loss=loss, group_size=8)
    cell = (int(max(horizons) * probe_r), b, probe_r)
    runs = (ProbeRun(("noise", "coupling", "bias", "reuse", "contribution"), cell, probe_steps,
                     float(np.exp(np.median(np.log(lrs)))), 4),)
    return VariantSpec(problem=prob, batch_size=b, rollouts=rollouts, horizons=horizons,
                       onpolicy_steps=t0, seeds=seeds, probe_runs=runs,
                       minibatch_every=max(1, t0 // 20), smoothness=prob.smoothness_at_init(),
                       f0=prob.initial_loss(), lrs=tuple(lrs))


def preset(name: str = "small") -> Settings:
    """Validation settings: "small" (minutes on 2 cores), "full" (the reported run), "tiny"."""
    checks.choice("preset", name, ("tiny", "small", "full"))
    tab_lrs = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
    if name == "tiny":
        quad = replace(_quadratic_spec(60, 1, (16, 8, 4), (1, 2, 4, 8), 16, 120, probe_r=8),
                       lr_scale=(2.0, 16.0, 1))
        tab = [_tabular_spec(loss, 40, 1, (32, 16, 8), (1, 2, 4), 32, (4.0, 16.0), 60,
                             probe_r=16) for loss in TABULAR_LOSSES]
        return Settings(mus=(2.0, 6.84), variants=(quad, *tab), regret_factor=2.0,
                        pipeline_rollouts=3000)
    if name == "small":
        quad = _quadratic_spec(600, 1, (48, 32, 24, 16, 12, 8, 6, 4, 3),
                               (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32), 48, 600)
        tab = [_tabular_spec(loss, 400, 4, (128, 64, 32, 16, 8), (1, 2, 4, 8, 16, 32), 128,
                             tab_lrs, 400) for loss in TABULAR_LOSSES]
        return Settings(variants=(quad, *tab))
    quad = _quadratic_spec(2000, 2, (64, 48, 32, 24, 16, 12, 8, 6, 4, 3),
                           (1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32), 64, 1500)
    tab = [_tabular_spec(loss, 1500, 8, (128, 64, 32, 16, 8), (1, 2, 4, 8, 16, 32), 128,
                         tab_lrs, 1500) for loss in TABULAR_LOSSES]
    return Settings(variants=(quad, *tab), pipeline_rollouts=200_000)


# ---- one variant -------------------------------------------------------------------------

@dataclass(frozen=True)
class VariantCalibration:
    """The fitted constants of one variant.

    Args:
        calibration: ``calibrate.Calibration`` (the designs are computed from it).
        fits: its summary as saved in every ``ScoreRecord``.
    """

    calibration: Calibration
    fits: FitSummary


def run_probes(spec: VariantSpec, seed: int, log=print) -> ProbeSet:
    """The calibration runs of ``spec.probe_runs``; run i uses seed ``seed + 1 + i`` and its
    rows get run ids offset by (i + 1) x 1e7 so runs never share an id."""
    probes = ProbeSet()
    for i, run in enumerate(spec.probe_runs):
        pr = simulate_replay(spec.problem, [run.cell], steps=run.steps, lrs=[run.lr], seeds=1,
                             probe_every=run.every, probe_start=run.start, seed=seed + 1 + i)
        kept = {name: {**t, "run": t["run"] + (i + 1) * 1e7}
                for name, t in pr.probes.tables.items()
                if name in run.tables and pr.probes.n_rows(name)}  # e.g. no clip: no rows
        probes = probes.extend(ProbeSet(kept))
        log(f"{spec.label}: probe run {run.cell}, lr {run.lr:g}, {run.steps} steps -> "
            + ", ".join(f"{pr.probes.n_rows(n)} {n} rows" for n in run.tables)
            + f", {pr.seconds:.1f} s")
    return probes


def _best_over_lrs(at: np.ndarray, lrs: np.ndarray) -> tuple[np.ndarray, list, list]:
    """For one cell's (mu, lr) losses at the budget: the best loss per mu (nan if every step
    size diverged), the best step size per mu, and the best step sizes' indices."""
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(at)
    loss = np.where(ok.any(1), np.nanmin(np.where(ok, at, np.inf), 1), np.nan)
    idx = [int(np.nanargmin(np.where(ok[m], at[m], np.inf))) for m in range(at.shape[0])]
    best_lr = [float(lrs[j]) if ok[m].any() else math.nan for m, j in enumerate(idx)]
    return loss, best_lr, idx


def run_grid(spec: VariantSpec, mus, seed: int, log=print) -> GridResult:
    """Simulate every grid cell long enough for every mu: the loss at each mu's budget at the
    best constant step size (module docstring, step 2)."""
    b, cells, xs, ys, best_lr, loss = spec.batch_size, [], [], [], [], []
    minibatch = []
    for r in spec.rollouts:
        y = b / r
        row = [(int(round(x * r)), b, int(r)) for x in spec.horizons if round(x * r) >= b]
        if not row:
            continue
        t_mu = [spec.budget(mu) / (b + mu * r) for mu in mus]
        lrs = spec.lrs_for(min(t_mu), max(t_mu))
        res = simulate_replay(spec.problem, row, steps=int(math.ceil(max(t_mu))), lrs=lrs,
                              seeds=spec.seeds, minibatch_every=spec.minibatch_every,
                              probe_lr=len(lrs) // 2, seed=seed)
        log(f"  grid y = {y:.3g}: {len(row)} cells x {len(lrs)} lrs x {spec.seeds} seeds, "
            f"{int(math.ceil(max(t_mu)))} steps, {res.seconds:.1f} s")
        at = np.stack([res.loss_at_budget(mu, spec.budget(mu)) for mu in mus])  # mu, cell, lr
        for i, cell in enumerate(row):
            cells.append(cell)
            xs.append(cell[0] / r)
            ys.append(y)
            cell_loss, cell_lr, idx = _best_over_lrs(at[:, i], lrs)
            loss.append(cell_loss)
            best_lr.append(cell_lr)
            if any(j in (0, len(lrs) - 1) for j in idx):
                log(f"    note: best step size at the edge of the grid for cell {cell}")
        minibatch.append(res.probes)
    probes = minibatch[0]
    for p in minibatch[1:]:
        probes = probes.extend(p)
    return GridResult(mus=tuple(mus), cells=np.array(cells), horizon=np.array(xs),
                      replay_ratio=np.array(ys), loss=np.array(loss).T,
                      best_lr=np.array(best_lr).T, probes=probes)


def fit_summary(cal: Calibration) -> FitSummary:
    """The constants, intervals and goodness-of-fit diagnostics saved with every record."""
    n, c = cal.noise, cal.coupling
    gof = {"noise_model": "power_law" if n.power_law_ok else "tabulated",
           "power_law_ok": n.power_law_ok, "noise_r2": n.r2, "noise_chi2": n.chi2,
           "noise_dof": n.dof, "noise_p_value": n.p_value, "noise_reason": n.reason,
           "top1_share_median": float(np.nanmedian(n.bins["top1_share"])),
           "coupling_form": c.form, "gap_form_ok": c.gap_form_ok, "coupling_r2": c.r2_gap,
           "coupling_reason": c.reason}
    bias = {}
    if cal.bias is not None:
        bias = dict(kappa=cal.bias.kappa, kappa_interval=tuple(cal.bias.kappa_interval))
        gof.update(bias_form_ok=cal.bias.drift_form_ok, bias_reason=cal.bias.reason,
                   bias_cos_grad=cal.bias.mean_cos_grad)
    if cal.decomposition is not None:
        gof.update(decomposition_holds=cal.decomposition.holds,
                   decomposition_p_value=cal.decomposition.p_value,
                   decomposition_rho_v=cal.decomposition.rho_v,
                   decomposition_ratio=cal.decomposition.ratio)
    return FitSummary(alpha=n.alpha, alpha_interval=tuple(n.alpha_interval), tau=n.tau,
                      tau_interval=tuple(n.tau_interval), rho=c.rho,
                      rho_interval=tuple(c.rho_interval), rho_gap=c.rho_gap,
                      rho_gap_interval=tuple(c.rho_gap_interval), rho_eff=c.rho_eff,
                      rho_eff_interval=tuple(c.rho_eff_interval), goodness_of_fit=gof, **bias)


def calibrate_variant(probes: ProbeSet, mu: float, seed: int) -> VariantCalibration:
    """Fit alpha, tau, rho, kappa (theory.md section 8) to the probe and grid probes."""
    cal = calibrate(probes, mu=mu, seed=seed)
    return VariantCalibration(calibration=cal, fits=fit_summary(cal))


def _snap(spec: VariantSpec, x: float, y: float) -> tuple[int, int, int]:
    """Nearest feasible integer (N, B, R) to (x, y): R a multiple of the group size, N >= B."""
    b, g = spec.batch_size, spec.granularity
    x_max = max(spec.horizons)
    y = min(max(y, 1e-9), x_max)
    r = max(g, int(round(b / y / g)) * g)
    n = int(round(min(max(x, 1.0), x_max) * r))
    return max(n, b, r), b, r


def _predict_finite_eta(spec: VariantSpec, cal: Calibration, mu: float) -> Prediction:
    """The finite-step-size bound's optimum at this budget (theory.md section 5.8)."""
    b, x_max = spec.batch_size, float(max(spec.horizons))
    d = cal.finite_lr_design(mu, batch_size=b, smoothness=spec.smoothness, f0=spec.f0,
                             budget=spec.budget(mu) / b, horizon_range=(1.0, x_max),
                             replay_range=(b / max(spec.rollouts), x_max))
    x, y = d.horizon, d.replay_ratio
    detail = FiniteEtaDetail(lr=d.lr, bound=d.bound.value, descent=d.bound.descent,
                             bias_driven=d.bound.bias_driven,
                             smoothness_driven=d.bound.smoothness_driven)
    return Prediction("finite_eta", (float(x), float(y)), _snap(spec, x, y),
                      "; ".join(d.notes), detail)


def predict_reuse(spec: VariantSpec, cal: Calibration, mu: float) -> tuple[Prediction, ...]:
    """Section 10's variants (``REUSE_DESIGNS``) with the fitted constants, as ``predict``
    does for the standard ones; a variant whose probe table is missing is left out."""
    b, x_max = spec.batch_size, float(max(spec.horizons))
    out = []
    for design in REUSE_DESIGNS:
        try:
            dsg = cal.design(mu, variant=design)
        except ValueError:
            continue
        x, y = dsg.horizon, dsg.replay_ratio
        if spec.granularity == 1:
            cfg = cal.optimal_config(mu, variant=design, batch_size=b, max_horizon=x_max)
            cell = (cfg.buffer_size, cfg.batch_size, int(round(cfg.rollouts_per_step)))
        else:
            cell = _snap(spec, x, y)
        out.append(Prediction(design, (float(x), float(y)), cell, "; ".join(dsg.notes)))
    return tuple(out)


def predict(spec: VariantSpec, cal: Calibration, mu: float) -> tuple[Prediction, ...]:
    """Each design's continuous (x*, y*) and integer (N, B, R), in ``DESIGNS`` order: section
    5's optimum with the fitted coupling (asymptotic) or the realised one (effective_coupling),
    and the finite-step-size optimum (finite_eta)."""
    b, x_max = spec.batch_size, float(max(spec.horizons))
    out = []
    for design in DESIGNS:
        if design == "finite_eta":
            out.append(_predict_finite_eta(spec, cal, mu))
            continue
        coupling = "theory" if design == "asymptotic" else "effective"
        dsg = cal.design(mu, coupling=coupling, variant=STANDARD)
        x, y = dsg.horizon, dsg.replay_ratio
        if spec.granularity == 1:
            cfg = cal.optimal_config(mu, coupling=coupling, variant=STANDARD, batch_size=b,
                                     max_horizon=x_max)
            cell = (cfg.buffer_size, cfg.batch_size, int(round(cfg.rollouts_per_step)))
        else:
            cell = _snap(spec, x, y)
        out.append(Prediction(design, (float(x), float(y)), cell, "; ".join(dsg.notes)))
    return tuple(out)


@dataclass(frozen=True)
class _Envelope:
    """Best-step-size loss against compute for one config (``_envelope``)."""

    compute: np.ndarray  # samples at each record
    loss: np.ndarray  # envelope over step sizes at each record
    at_budget: float  # loss at the budget, best step size


def _envelope(spec: VariantSpec, cell, mu, factor, seed) -> _Envelope:
    """Best-step-size loss against compute for one config, up to ``factor`` x the budget.

    Every config scored this way gets the same protocol: step sizes relative to its own
    budget length (the grid's rule, at twice its resolution), the same seeds and horizon.
    """
    n, b, r = cell
    budget = spec.budget(mu)
    t_budget = budget / (b + mu * r)
    steps = int(math.ceil(factor * t_budget))
    fine = replace(spec, lr_scale=(*spec.lr_scale[:2], 2 * spec.lr_scale[2]))
    lrs = fine.lrs_for(t_budget / 2, factor * t_budget)
    res = simulate_replay(spec.problem, [cell], steps=steps, lrs=lrs, seeds=spec.seeds,
                          record_every=max(1, steps // 600), seed=seed)
    curves = res.mean_loss()[0]  # lr, record
    env = np.nanmin(np.where(np.isfinite(curves), curves, np.inf), axis=0)
    return _Envelope(res.record_steps * (b + mu * r), env,
                     float(np.nanmin(res.loss_at_budget(mu, budget)[0])))


def _regret(env: _Envelope, target: float, budget: float) -> float:
    """C_needed / C - 1 (theory.md section 5's compute): the compute at which the envelope
    first reaches ``target`` (log-linear between records), over the budget; inf if it never
    does within the simulated range."""
    hit = np.flatnonzero(env.loss <= target)
    if hit.size == 0:
        return math.inf
    k = int(hit[0])
    if k == 0:
        return -1.0
    lc = np.log(env.compute[k - 1:k + 1].clip(1e-300))
    le = np.log(env.loss[k - 1:k + 1])
    frac = (math.log(target) - le[0]) / (le[1] - le[0]) if le[1] < le[0] else 1.0
    return math.exp(lc[0] + frac * (lc[1] - lc[0])) / budget - 1.0


def score(spec: VariantSpec, grid: GridResult, m: int, predictions, cal: VariantCalibration,
          *, regret_factor: float, seed: int, log=print) -> tuple[ScoreRecord, ...]:
    """Score each prediction at mu = ``grid.mus[m]`` against the grid's best cell (module
    docstring, step 3); one ``ScoreRecord`` per prediction."""
    mu, k = grid.mus[m], grid.best(m)
    losses = grid.loss[m]
    best_x, best_y = float(grid.horizon[k]), float(grid.replay_ratio[k])
    best_cell = tuple(int(c) for c in grid.cells[k])
    near = np.flatnonzero(losses <= (1 + NEAR_BEST) * losses[k])
    near_best = tuple((float(grid.horizon[i]), float(grid.replay_ratio[i])) for i in near)
    envs = {best_cell: _envelope(spec, best_cell, mu, regret_factor, seed + 7)}
    target = envs[best_cell].at_budget  # the best cell's loss under the scoring protocol
    records = []
    for p in predictions:
        if p.cell not in envs:
            envs[p.cell] = _envelope(spec, p.cell, mu, regret_factor, seed + 7)
        regret = _regret(envs[p.cell], target, spec.budget(mu))
        n, b, r = p.cell
        records.append(ScoreRecord(
            problem=spec.problem.name, loss=getattr(spec.problem, "loss", "quadratic"), mu=mu,
            design=p.design, predicted_horizon=n / r, predicted_replay_ratio=b / r,
            best_horizon=best_x, best_replay_ratio=best_y,
            regret=regret if math.isfinite(regret) else None,
            regret_exceeds=None if math.isfinite(regret) else regret_factor - 1,
            replay_ratio_ratio=(b / r) / best_y, horizon_ratio=(n / r) / best_x,
            predicted_continuous=p.continuous, predicted_cell=p.cell, best_cell=best_cell,
            best_loss=target, best_loss_grid=float(losses[k]), near_best_cells=near_best,
            predicted_loss_at_budget=envs[p.cell].at_budget,
            loss_ratio_at_budget=envs[p.cell].at_budget / target, budget=spec.budget(mu),
            fits=cal.fits, design_notes=p.note, design_detail=p.detail,
            best_lr=float(grid.best_lr[m][k]), calibration_notes=tuple(cal.calibration.notes)))
        shown = ("> %g" % (regret_factor - 1) if not math.isfinite(regret)
                 else "%.3f" % regret)
        log(f"  mu = {mu:g} {p.design:>18}: predicted (x, y) = ({n / r:.3g}, {b / r:.3g}), "
            f"best ({best_x:.3g}, {best_y:.3g}), regret = {shown}")
    return tuple(records)


def run_variant(spec: VariantSpec, mus, *, regret_factor: float, seed: int, out_dir: str,
                log=print, grid: GridResult | None = None) -> VariantResult:
    """Probe, simulate the grid, calibrate, predict and score one variant; writes its
    ``probes_``, ``calibration_``, ``grid_LABEL`` and ``reuse_LABEL`` files (``sim_records``;
    the last holds the ``ScoreRecord`` objects of section 10's variants) into ``out_dir``.
    ``grid``: a grid already simulated with these settings (it is deterministic), to skip it.
    """
    label = spec.label
    t0 = time.perf_counter()
    probes = run_probes(spec, seed, log)
    grid = run_grid(spec, mus, seed, log) if grid is None else grid
    if grid.probes is not None:  # a grid read back from its file has no minibatch probes
        probes = probes.extend(grid.probes)
    probes.save(os.path.join(out_dir, f"probes_{label}.npz"))
    cal = calibrate_variant(probes, mus[0], seed)
    write_json(os.path.join(out_dir, f"calibration_{label}.json"), cal.calibration.to_dict())
    f = cal.fits
    log(f"{label}: alpha = {f.alpha:.3g} {list(f.alpha_interval)}, rho = {f.rho:.3g} "
        f"({cal.calibration.coupling.form}), rho_eff = {f.rho_eff:.3g}")
    predictions = tuple(predict(spec, cal.calibration, mu) for mu in mus)
    records = [rec for m in range(len(mus))
               for rec in score(spec, grid, m, predictions[m], cal,
                                regret_factor=regret_factor, seed=seed, log=log)]
    reuse_records = [rec for m, mu in enumerate(mus)
                     for rec in score(spec, grid, m, predict_reuse(spec, cal.calibration, mu),
                                      cal, regret_factor=regret_factor, seed=seed, log=log)]
    write_json(os.path.join(out_dir, f"reuse_{label}.json"),
               [r.to_json() for r in reuse_records])
    result = VariantResult(label=label, problem=spec.problem.to_dict(), grid=grid,
                           predictions=predictions, records=tuple(records),
                           seconds=time.perf_counter() - t0)
    save_variant(result, out_dir)
    return result


def pipeline_histograms(rollouts: int, seed: int = 0) -> list[PipelineRun]:
    """Fig. 2 style runs: N in {84, 252, 756, 2268} at (W, T) = (6, 2); N = 252 at (6, 2),
    (5, 3), (4, 4); mu = 6.84, B = 60, sharded FIFO, refresh every step (sections 1-2)."""
    runs = [(6, 2, n) for n in (84, 252, 756, 2268)] + [(5, 3, 252), (4, 4, 252)]
    out = []
    for w, t, n in runs:
        res = simulate_pipeline(workers=w, trainers=t, mu=6.84, batch_size=60, buffer_size=n,
                                rollouts=rollouts, seed=seed)
        out.append(PipelineRun(workers=w, trainers=t, buffer_size=n, **res.summary(),
                               histograms=res.histograms))
    return out


def run_validation(out_dir: str, settings: Settings | None = None, *,
                   log=print) -> ValidationResults:
    """Run the whole validation (module docstring) and write its files into ``out_dir``
    (layout: ``sim_records``). The figures are drawn from them by
    ``python -m figures.sim_validation OUT_DIR``."""
    settings = preset("small") if settings is None else settings
    checks.real("regret_factor", settings.regret_factor, 1.0, math.inf, lo_open=True)
    os.makedirs(out_dir, exist_ok=True)
    variants = tuple(run_variant(spec, settings.mus, regret_factor=settings.regret_factor,
                                 seed=settings.seed, out_dir=out_dir, log=log)
                     for spec in settings.variants)
    results = ValidationResults(
        variants=variants,
        pipeline=tuple(pipeline_histograms(settings.pipeline_rollouts, settings.seed)))
    save_summary(results, out_dir)
    return results


__all__ = ["DESIGNS", "REUSE_DESIGNS", "ProbeRun", "Settings", "VariantCalibration", "VariantSpec",
           "calibrate_variant", "fit_summary", "pipeline_histograms", "predict", "predict_reuse",
           "preset",
           "run_grid", "run_probes", "run_validation", "run_variant", "score"]
