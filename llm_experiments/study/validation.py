"""The prediction pipeline: calibrate from probes, predict (x*, y*), judge against the sweep.

For each loss and each mu (the CPU model's measured mu and accounting values):

1. ``calibration(...)``: the probes of the calibration runs (``probes.npz`` in the
   ``replaytheory.fit.probes`` layout, sequence units: the harness samples single rollouts) go
   through ``replaytheory.fit.calibrate``: sigma(s) (power law, or the measured table when the
   power law does not describe the data), rho (the gap form of A3, or the effective rho),
   kappa, plus the smoothness L estimated from how the reference gradient moved between probes
   against the parameter drift, and F(theta_0) >= ||g_0||^2 / (2L) (the smallest value an
   L-smooth F allows; the RL objective's own scale is not the gradient's).
2. ``predict``: each model variant gives a predicted (x*, y*) and an objective over the grid:
   ``asymptotic`` (theory.md section 5 with the calibrated constants), ``effective_coupling``
   (the same J with rho replaced by the coupling the buffer realises; a named extension of
   ``replaytheory.fit.calibrate``), ``finite_eta`` (the Theorem's full bound at this batch and
   budget, section 4, step size optimised), and theory.md section 10's ``self_correlated``,
   ``clipping`` and ``reuse_clipping`` (fitted from the ``reuse`` and ``contribution`` probe
   tables; a calibration without them leaves these variants out, see ``calibrated``).
3. ``validate``: the sweep's cells are scored by compute to reach the target accuracy (best
   learning rate per cell, median over seeds). Per (mu, loss, variant): the best cell, the
   cell nearest the prediction (on-policy when the prediction is on-policy; of cells equally
   near, the worse, the others in ``predicted_tied``), the regret (its
   extra compute to reach the target), the Spearman correlation of the predicted objective
   with the measured compute over the grid cells, and the gate (the grid's split-half
   agreement with itself). ``validation.json`` holds one record per (mu, loss, variant), with
   each grid cell's predicted objective and measured compute (``cells``), and one record per
   loss with the calibration summary.

``python -m llm_experiments.study.validation --curves results/cpu_sweep/curves.jsonl
--calibration results/cpu_sweep/calibration --out results/cpu_sweep/validation.json``
"""

from __future__ import annotations

import argparse
import glob
import math
import os
from dataclasses import dataclass

import numpy as np

from replaytheory import calibrate, finite_lr_objective, objective
from replaytheory.stats.analysis import regret, spearman
from replaytheory.io import write_json
from replaytheory.fit.probes import UNIT_SEQUENCE, ProbeSet
from replaytheory.model.reuse import VARIANTS as REUSE_VARIANTS
from replaytheory.model.reuse import objective as reuse_objective
from replaytheory.stats.verdicts import TIE_RTOL

from .cells import (GATE_THRESHOLD, TARGET, CellScore, best_cell, cell_scores, compute_score,
                    gate, kind, measured_mu)
from .results import load_runs

# The last three are theory.md section 10's reuse-aware variants (``replaytheory.model.reuse``).
VARIANTS = ("asymptotic", "effective_coupling", "finite_eta", *REUSE_VARIANTS)
# The horizon model's readouts (theory.md section 11; llm_experiments.study.horizon_predict): its
# best buffer design, and its choice between that and on-policy training. Registered from
# panel probes, not predicted by ``predict``.
HORIZON_VARIANTS = ("horizon", "horizon_vs_on_policy", "horizon_one_phase")
ACCOUNTING_MUS = (2.0, 6.84)


def load_probes(paths, unit: int = UNIT_SEQUENCE) -> ProbeSet:
    """Merge the probes of several runs (tagged by a ``run`` column), keeping one unit for
    the noise and coupling rows (the bias, a mean gradient, is the same in both units)."""
    if not paths:
        raise FileNotFoundError("no probes.npz given for calibration")
    merged = None
    for i, path in enumerate(sorted(paths)):
        p = ProbeSet.load(path)
        tables = {}
        for name, t in p.tables.items():
            keep = t["unit"] == unit if name in ("noise", "coupling") \
                else np.ones(p.n_rows(name), bool)
            tables[name] = {c: col[keep] for c, col in t.items()}
            tables[name]["run"] = np.full(int(keep.sum()), float(i))
        p = ProbeSet(tables, p.counts)
        merged = p if merged is None else merged.extend(p)
    return merged


def smoothness(probes: ProbeSet) -> tuple[float, float]:
    """(L, F0): L from ||g_ref(t) - g_ref(t')||^2 / ||theta_t - theta_t'||^2 between
    consecutive probes (median over pairs, errors of both references removed), and
    F0 = ||g_0||^2 / (2L) from the first probe's reference gradient."""
    mb = probes.tables["minibatch"]
    if "grad_change_sq" not in mb or probes.n_rows("minibatch") < 2:
        raise ValueError("the probes carry no reference-gradient changes (minibatch."
                         "grad_change_sq): rerun the calibration with the current harness")
    ok = mb["drift_prev"] > 0
    ratios = np.maximum(mb["grad_change_sq"][ok], 0) / mb["drift_prev"][ok] ** 2
    if ratios.size == 0 or not np.any(ratios > 0):
        raise ValueError("no usable pair of probes to estimate the smoothness L")
    big_l = float(np.sqrt(np.median(ratios[ratios > 0])))
    first = np.argmin(mb["probe_step"] + 1e9 * mb.get("run", np.zeros(len(ok))))
    return big_l, float(mb["grad_sq"][first] / (2 * big_l))


@dataclass(frozen=True)
class ProbeFit:
    """What a prediction uses from calibration probes: the calibration (``replaytheory.
    calibrate``: sigma(s), rho, kappa and the reuse tables), the smoothness L (> 0) and
    F0 = ||g_0||^2 / (2L) (``smoothness``)."""

    cal: object
    big_l: float
    f0: float

    @classmethod
    def of(cls, paths) -> ProbeFit:
        """The fit of the probe files ``paths`` (``load_probes``)."""
        probes = load_probes(paths)
        cal = calibrate(probes, probes.counts)
        big_l, f0 = smoothness(probes)
        return cls(cal=cal, big_l=big_l, f0=f0)


@dataclass
class Prediction:
    """A variant's predicted optimum and its objective over (x, y) (lower = better)."""

    variant: str
    horizon: float
    replay_ratio: float
    on_policy: bool
    objective: object  # callable (x, y) -> array
    notes: tuple


def predict(fit: ProbeFit, variant: str, mu: float, *, batch_size: int, budget: float,
            extrapolate: str = "none") -> Prediction:
    """The variant's prediction with the calibrated constants (see the module docstring):
    ``batch_size`` rollouts per update, ``budget`` in trainer updates (the finite-eta bound's).

    ``extrapolate``: how a measured noise table reaches past its staleness range, one of
    ``replaytheory.model.noise.EXTRAPOLATIONS`` (theory.md section 4.6; "none" caps x* there)."""
    cal, big_l, f0 = fit.cal, fit.big_l, fit.f0
    noise = cal.noise_model(extrapolate=extrapolate)
    if variant in ("asymptotic", "effective_coupling"):
        coupling = "theory" if variant == "asymptotic" else "effective"
        d = cal.design(mu, coupling=coupling, variant="standard", extrapolate=extrapolate)
        rho = cal.rho(coupling)
        return Prediction(variant=variant, horizon=d.horizon, replay_ratio=d.replay_ratio,
                          on_policy=d.regime == "on-policy", notes=d.notes,
                          objective=lambda x, y: objective(x, y, mu=mu, rho=rho, noise=noise))
    if variant == "finite_eta":
        f = cal.finite_lr_design(mu, batch_size=batch_size, smoothness=big_l, f0=f0,
                                 budget=budget, extrapolate=extrapolate)
        rho, kappa = cal.rho(), cal.bias.kappa

        def obj(x, y):
            return finite_lr_objective(x, y, mu=mu, rho=rho, noise=noise,
                                       batch_size=batch_size, smoothness=big_l, kappa=kappa,
                                       f0=f0, budget=budget)[0]

        return Prediction(variant=variant, horizon=f.horizon, replay_ratio=f.replay_ratio,
                          on_policy=f.horizon < 1, objective=obj, notes=f.notes)
    if variant in REUSE_VARIANTS:  # raises ValueError when the run lacks the probe tables
        d = cal.design(mu, variant=variant, extrapolate=extrapolate)
        reuse, contribution = cal.reuse_terms(variant)
        rho = cal.rho()
        return Prediction(variant=variant, horizon=d.horizon, replay_ratio=d.replay_ratio,
                          on_policy=d.regime == "on-policy", notes=d.notes,
                          objective=lambda x, y: reuse_objective(
                              x, y, mu=mu, rho=rho, noise=noise, reuse=reuse,
                              contribution=contribution))
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


def _nearest(cells, x, y):
    """(judged cell, other equally near cells): the grid cells nearest (x, y) in log space
    (the prediction clipped to the grid; x = inf is the largest horizon), equal up to
    ``replaytheory.stats.verdicts.TIE_RTOL``; the judged one is the worse, the one needing more
    compute to reach the target (theory.md section 8.3)."""
    def dist(c):
        return (math.log(c.horizon) - math.log(min(max(x, 1e-9), 1e9))) ** 2 + \
            (math.log(c.replay_ratio) - math.log(min(max(y, 1e-9), 1e9))) ** 2
    d = [dist(c) for c in cells]
    near = [c for c, dc in zip(cells, d)
            if math.isclose(dc, min(d), rel_tol=TIE_RTOL, abs_tol=1e-12)]
    worst = max(near, key=lambda c: -math.inf if math.isnan(c.median) else c.median)
    return worst, [c for c in near if c is not worst]


def calibrated(cal, variant: str) -> bool:
    """Whether the calibration holds the constants ``variant`` needs: the reuse-aware variants
    (section 10) need the ``reuse`` / ``contribution`` probe tables, which earlier
    calibrations (e.g. results/cpu_sweep/calibration) lack; they are then left out."""
    return variant not in REUSE_VARIANTS or (
        (cal.reuse is not None or variant == "clipping")
        and (cal.contribution is not None or variant == "self_correlated"))


def validate(curves: str, calibration_dir: str, *, target: float = TARGET,
             mus=None, variants=VARIANTS) -> list[dict]:
    """One record per (mu, loss, variant) and one per loss with its calibration; see the
    module docstring."""
    records = []
    all_runs = load_runs(curves)
    for loss in sorted({r.get("trainer.loss") for r in all_runs}):
        runs = [r for r in all_runs if r.get("trainer.loss") == loss]
        fit = ProbeFit.of(glob.glob(os.path.join(calibration_dir, f"*{loss}*.npz")))
        for mu in list(mus) if mus is not None else [measured_mu(runs), *ACCOUNTING_MUS]:
            scored = ScoredGrid.of(runs, loss=loss, mu=mu, target=target)
            for variant in [v for v in variants if calibrated(fit.cal, v)]:
                try:
                    pred = predict(fit, variant, mu, batch_size=runs[0].batch_size,
                                   budget=scored.budget)
                except ValueError as exc:
                    records.append({"mu": mu, "loss": loss, "variant": variant,
                                    "error": str(exc)})
                    continue
                records.append(variant_record(scored, pred))
        records.append({"loss": loss, "calibration": _summary(fit)})
    return records


@dataclass(frozen=True)
class ScoredGrid:
    """The cells of one loss's sweep scored by compute to ``target`` (accuracy) at ``mu``:
    the grid cells, the on-policy cell, the best of both, the split-half gate and the budget
    of the on-policy run (its compute, trainer updates: the finite-eta bound's)."""

    loss: str
    mu: float
    target: float
    grid: list
    on_policy: CellScore
    best: CellScore
    gate: float
    budget: float

    @classmethod
    def of(cls, runs: list, *, loss: str, mu: float, target: float) -> ScoredGrid:
        grid_runs = [r for r in runs if kind(r) in ("grid", "on_policy")]
        scores = cell_scores(grid_runs, compute_score(mu, target), "min")
        steps = int(max(r.eval["step"][-1] for r in runs))
        return cls(loss=loss, mu=mu, target=target,
                   grid=[c for c in scores if c.kind == "grid"],
                   on_policy=next(c for c in scores if c.kind == "on_policy"),
                   best=best_cell(scores, "min", kinds=("grid", "on_policy")),
                   gate=gate(grid_runs, compute_score(mu, target), "min"),
                   budget=steps * (1 + mu))


def variant_record(s: ScoredGrid, pred: Prediction) -> dict:
    """One (mu, loss, variant) record: the prediction, its cell (on-policy, or the worse of
    the grid cells nearest it, ``_nearest``), the best cell, the regret, the Spearman of its
    objective with the measured compute over the grid cells and the gate."""
    chosen, tied = (s.on_policy, []) if pred.on_policy else _nearest(
        s.grid, pred.horizon, pred.replay_ratio)
    j = np.array([float(pred.objective(c.horizon, c.replay_ratio)) for c in s.grid])
    measured = np.array([c.median for c in s.grid])
    best = s.best
    return {
        "mu": s.mu, "mu_source": "measured" if s.mu not in ACCOUNTING_MUS else "accounting",
        "loss": s.loss, "variant": pred.variant,
        "predicted_horizon": pred.horizon, "predicted_replay_ratio": pred.replay_ratio,
        "predicted_on_policy": pred.on_policy,
        "predicted_cell": chosen.label, "best_cell": best.label,
        "best_horizon": best.horizon, "best_replay_ratio": best.replay_ratio,
        "best_lr": best.lr, "target": s.target,
        "best_compute": best.median, "predicted_compute": chosen.median,
        "on_policy_compute": s.on_policy.median,
        "spearman": spearman(j, measured),
        "regret": regret(chosen.median, best.median)
        if 0 < best.median < math.inf else math.nan,
        "gate_spearman": s.gate, "gate_passed": bool(s.gate >= GATE_THRESHOLD),
        "n_cells": len(s.grid),
        "cells": [{"label": c.label, "horizon": c.horizon,
                   "replay_ratio": c.replay_ratio, "predicted_objective": float(jv),
                   "measured_compute": c.median}
                  for c, jv in zip(s.grid, j)],
        "notes": list(pred.notes),
        # cells as near the prediction as the judged (worse) one
        "predicted_tied": [{"cell": c.label, "compute": c.median} for c in tied]}


def _summary(fit: ProbeFit) -> dict:
    cal, big_l, f0 = fit.cal, fit.big_l, fit.f0
    n, c = cal.noise, cal.coupling
    out = {"alpha": n.alpha, "alpha_interval": list(n.alpha_interval), "tau": n.tau,
           "tau_interval": list(n.tau_interval), "noise_r2": n.r2, "noise_p_value": n.p_value,
           "power_law_ok": n.power_law_ok, "noise_reason": n.reason,
           "sigma2_by_staleness": {"staleness": list(n.bins["staleness"]),
                                   "mean": list(n.bins["mean"]),
                                   "median": list(n.bins["median"]),
                                   "top1_share": list(n.bins["top1_share"])},
           "rho": c.rho, "rho_interval": list(c.rho_interval), "rho_form": c.form,
           "rho_gap": c.rho_gap, "rho_eff": c.rho_eff,
           "rho_eff_interval": list(c.rho_eff_interval), "gap_form_ok": c.gap_form_ok,
           "coupling_reason": c.reason, "smoothness_L": big_l, "f0": f0,
           "mu_calibration_run": cal.mu, "notes": list(cal.notes)}
    if cal.bias is not None:
        out.update({"kappa": cal.bias.kappa, "kappa_interval": list(cal.bias.kappa_interval),
                    "bias_cos_grad": cal.bias.mean_cos_grad,
                    "bias_to_grad": cal.bias.bias_to_grad,
                    "bias_drift_form_ok": cal.bias.drift_form_ok})
    if cal.decomposition is not None:
        d = cal.decomposition.to_dict()
        out["decomposition"] = {k: val for k, val in d.items()
                                if not isinstance(val, (list, dict))}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--curves", required=True, help="compact sweep results (curves.jsonl)")
    p.add_argument("--calibration", required=True,
                   help="folder of the calibration probes, files named *<loss>*.npz")
    p.add_argument("--out", required=True, help="validation.json to write")
    p.add_argument("--target", type=float, default=TARGET, help="accuracy target")
    a = p.parse_args(argv)
    records = validate(a.curves, a.calibration, target=a.target)
    write_json(a.out, records)
    for r in records:
        if "variant" in r and "error" not in r:
            print(f"{r['loss']:7s} mu={r['mu']:<6.3g} {r['variant']:19s} predicted "
                  f"({r['predicted_horizon']:.3g}, {r['predicted_replay_ratio']:.3g}) -> "
                  f"{r['predicted_cell']:>14s} | best {r['best_cell']:>14s} | regret "
                  f"{r['regret']:.2f} | spearman {r['spearman']:.2f} | gate "
                  f"{r['gate_spearman']:.2f}{'' if r['gate_passed'] else ' (gate not met)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
