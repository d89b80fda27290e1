"""Judge a pre-registered sweep: seed-bootstrap verdicts on where the optimum is and how each
prediction fares (theory.md section 8).

The registration (``preregistration.json``, committed before the sweep's runs) fixes the grid,
the primary measure, the secondary targets, the bootstrap and the predictions to judge. For
each mu (the measured one, the accounting values, and each cell's own measured mu) and each
measure, ``judge`` writes one record: every cell's median score at its best learning rate and
its probability of being best, the bootstrap-mode best cell, whether it is interior to the
grid, each prediction's nearest cell with its regret (median and interval), the Spearman of
each prediction's objective J with the measured scores (interval), on-policy's regret (the
no-buffer advice a prediction must beat; None for a grid without it), the split-half gate, the
registration judged and the curves files read (path and sha256 of the bytes of each, to find
in git history: ``provenance.py``).

Ties: a prediction as near two cells (squared log distances equal up to ``TIE_RTOL``, as
x* = 8 is to horizons 4 and 16) is judged at both in the same draws; ``cell`` and ``regret``
are the worse one's (``worse``), ``tied`` holds the other, ``nearest_cell`` the cell the
floating-point distance alone would pick. x* = inf is the grid's largest horizon, and a
prediction past it is flagged (``x_beyond_grid``).

Beside them (issue 25; ``best_region``): the registered primary variant, three baselines in
the same draws (``baselines``: on-policy, the rule x = 64, y = sqrt(mu) at its nearest cell
with ties as above, section 5's model = the ``asymptotic`` prediction when registered), the
best horizon with leave-one-seed-out differences to its neighbours (``best_horizon``), the
cells within the noise of the best (``within_noise``) and, in the AUC records, compute to two
targets (``compute_to_target``).

Measures: ``auc`` (primary, higher is better): mean accuracy over compute in [0, C(mu)],
C(mu) = steps (1 + mu / y_max), the compute the cheapest cell spends in the run
(``replaytheory.analysis.mean_over_budget``); ``target=a`` (lower is better): compute to
first reach accuracy a.

In measured seconds (``--seconds``, or ``"wall_clock": true`` in the registration; issue 27,
theory.md section 3.7): one more record, ``measure`` "auc_seconds", ``mu_source``
"seconds": mean accuracy over each run's own measured seconds (``seconds.RunCosts``) in
[0, the cheapest cell's median run seconds] (``budget``, seconds), its predictions and rule
judged at the measured mu, seconds to the two targets (``compute_to_target``, in seconds),
and every cell's update cost and mu in the unit C = an on-policy update of B rollouts
(``costs``, ``seconds.cell_costs``). The compute-unit records are unchanged.

``python -m llm_experiments.judge --curves results/cpu_sweep_v2/curves.jsonl
--registration results/cpu_sweep_v2/preregistration.json --calibration
results/cpu_sweep/calibration --out results/cpu_sweep_v2/validation.json``
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
from dataclasses import dataclass

import numpy as np

from replaytheory import calibrate
from replaytheory import horizon as hz
from replaytheory.analysis import (best_option, compute_to_target as curve_to_target,
                                   mean_over_budget, split_half_spearman)
from replaytheory.checks import choice
from replaytheory.cli_input import (BadInput, Parser, existing_file, file_label, missing_field,
                                    one_line, output_file, read_json)
from replaytheory.io import write_json
from replaytheory.noise import EXTRAPOLATIONS
from replaytheory.verdicts import (TIE_RTOL, bootstrap_verdict, gate_distribution, regret_gain,
                                   regret_ratio)

from .best_region import best_horizon, compute_to_target, default_targets, within_noise
from .cells import kind, xy
from .results import Run, by_cell, load_runs, same_warm_start
from .seconds import cell_costs, seconds_at_evals, seconds_budget
from .validation import HORIZON_VARIANTS, VARIANTS, load_probes, predict, smoothness

# what ``Registration.load`` reads, for its error messages
REGISTRATION = "a registration (predict's prediction.json or a preregistration.json)"
MEASURED = "measured"
CELL_MU = "cell"
SECONDS = "seconds"  # the mu_source of the wall-clock record


@dataclass(frozen=True)
class Registration:
    """What a pre-registration fixes (fields of ``preregistration.json``)."""

    name: str
    loss: str
    steps: int
    horizons: tuple
    replay_ratios: tuple
    accounting_mus: tuple
    budget_replay_ratio: float
    targets: tuple
    draws: int
    level: float
    rng_seed: int
    threshold: float
    predictions: dict  # variant -> {mu key: (x*, y*)}; the non-accounting key is "measured"
    extrapolate: str = "none"  # how the predictions' noise table reached past its range
    # Which file, byte for byte, the verdicts judge: git history can then show that this
    # exact registration was committed before the runs.
    path: str = ""
    sha256: str = ""
    # The calibration's initial policy ({"warm_start_sha256", "warm_start_accuracy"}; None in
    # registrations from before predict recorded it): the grid's runs must share it.
    warm_start: dict | None = None
    # The registered primary variant (None in registrations without one) and the accuracies
    # of the compute-to-target comparison beside AUC (empty: ``best_region.default_targets``)
    primary_variant: str | None = None
    compute_targets: tuple = ()
    # Also judge in measured seconds (the "auc_seconds" record; ``--seconds`` sets it too)
    wall_clock: bool = False
    # A horizon-model registration's record (``horizon_predict``): its J per cell comes from
    # the panel fit it holds, not from a calibration folder
    horizon_model: dict | None = None

    def __post_init__(self):
        choice("extrapolate", self.extrapolate, EXTRAPOLATIONS)

    @classmethod
    def load(cls, path: str, flag: str = "--registration") -> Registration:
        """Read a registration file; ``BadInput`` names ``flag``, the file and what is wrong
        (unreadable, not JSON, a field missing or of the wrong type)."""
        d = read_json(path, flag)
        try:
            acc = tuple(float(m) for m in d["accounting_mus"])
            preds = {}  # a variant without an optimum at some mu carries the reason, not (x, y)
            for variant, by_mu in d["predictions_judged"].items():
                if isinstance(by_mu, dict) and variant in (*VARIANTS, *HORIZON_VARIANTS):
                    preds[variant] = {_mu_key(k, acc): tuple(xy_) for k, xy_ in by_mu.items()
                                      if isinstance(xy_, list)}
            return cls(d["name"], d["loss"], int(d["steps"]), tuple(d["horizons"]),
                       tuple(d["replay_ratios"]), acc,
                       float(d["primary_measure"]["budget_replay_ratio"]),
                       tuple(d.get("secondary_targets", ())), int(d["bootstrap"]["draws"]),
                       float(d["bootstrap"]["interval"]), int(d["bootstrap"]["rng_seed"]),
                       float(d["gate"]["threshold"]), preds, d.get("extrapolate", "none"),
                       path, file_sha256(path), d.get("warm_start"),
                       primary_variant=d.get("primary_variant"),
                       compute_targets=tuple(float(a) for a in d.get("compute_targets", ())),
                       wall_clock=bool(d.get("wall_clock", False)),
                       horizon_model=d.get("horizon_model"))
        except KeyError as exc:
            raise missing_field(exc, path, flag, REGISTRATION) from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise BadInput(f"{file_label(path, flag)}: {one_line(exc)}; expected "
                           f"{REGISTRATION}") from None


def file_sha256(path: str) -> str:
    """The sha256 (hex) of a file's bytes: what a verdict record names it by."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _mu_key(key: str, accounting: tuple) -> str:
    return f"{float(key):g}" if float(key) in accounting else MEASURED


@dataclass(frozen=True)
class Measure:
    """A way to score a run at given mus: name, better ("max"/"min") and the score."""

    name: str
    better: str
    score: object  # (run, mu) -> float


def measures(reg: Registration, budget_of) -> list[Measure]:
    """The primary measure (AUC over the budget ``budget_of(mu)``) and the targets."""
    out = [Measure("auc", "max", lambda r, mu: mean_over_budget(
        r.compute(mu), r.eval["eval_accuracy"], budget_of(mu)))]
    for a in reg.targets:
        out.append(Measure(f"target={a:g}", "min",
                           lambda r, mu, a=a: r.compute_to_target(mu, a)))
    return out


@dataclass
class SweepGrid:
    """The judged cells (grid and on-policy) and their (cells, lrs, seeds) score layout."""

    cells: list
    runs: dict
    labels: list
    horizons: np.ndarray
    ratios: np.ndarray
    on_policy: int
    lrs: list
    seeds: list
    batch_size: int

    @classmethod
    def of(cls, runs: list[Run]) -> SweepGrid:
        groups = {c: rs for c, rs in by_cell(runs).items()
                  if kind(rs[0]) in ("grid", "on_policy")}
        cells = sorted(groups, key=lambda c: (kind(groups[c][0]) != "on_policy",
                                              xy(groups[c][0])))
        pts = [xy(groups[c][0]) for c in cells]
        labels = ["on-policy" if kind(groups[c][0]) == "on_policy" else f"x={x:g}, y={y:g}"
                  for c, (x, y) in zip(cells, pts)]
        onp = labels.index("on-policy") if "on-policy" in labels else -1
        members = [r for c in cells for r in groups[c]]
        return cls(cells, groups, labels, np.array([p[0] for p in pts]),
                   np.array([p[1] for p in pts]), onp, sorted({r.lr for r in members}),
                   sorted({r.seed for r in members}), members[0].batch_size)

    def table(self, score) -> np.ndarray:
        """(cells, lrs, seeds) of ``score(run)``, NaN for missing runs."""
        t = np.full((len(self.cells), len(self.lrs), len(self.seeds)), np.nan)
        for i, c in enumerate(self.cells):
            for r in self.runs[c]:
                t[i, self.lrs.index(r.lr), self.seeds.index(r.seed)] = score(r)
        return t

    def equally_near(self, x: float, y: float) -> list[int]:
        """The cells nearest (x, y) in (log x, log y): the exactly nearest in floating point
        first, then every other cell as near up to ``TIE_RTOL`` (x* = 8 between horizons 4 and
        16). On-policy alone if x < 1 (the prediction is on-policy: a horizon under one step).
        x = inf (the objective keeps falling with the horizon) means the grid's largest
        horizon, y = inf its largest replay ratio. x = 0 is on-policy too (section 5.4 returns
        an on-policy regime so). ValueError for a NaN or negative x, or, with x >= 1, a NaN or
        non-positive y."""
        if not x >= 0:
            raise ValueError(f"x_star must be >= 0 (inf allowed; < 1 is on-policy), got {x!r}")
        if x < 1 and self.on_policy >= 0:
            return [self.on_policy]
        if not y > 0:
            raise ValueError(f"y_star must be > 0 (inf allowed), got {y!r}")
        grid = [i for i in range(len(self.cells)) if i != self.on_policy]
        for values, target in ((self.horizons, x), (self.ratios, y)):
            if math.isinf(target):  # log distances would all be inf: the edge, explicitly
                top = max(values[i] for i in grid)
                grid = [i for i in grid if values[i] == top]
        d = self._log_distances(x, y, grid)
        order = np.argsort(d, kind="stable")
        return [grid[k] for k in order
                if math.isclose(d[k], d[order[0]], rel_tol=TIE_RTOL, abs_tol=1e-12)]

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of every cell, on-policy as (1, 1): where a model's J is evaluated."""
        onp = np.arange(len(self.cells)) == self.on_policy
        return np.where(onp, 1.0, self.horizons), np.where(onp, 1.0, self.ratios)

    def beyond_grid(self, x: float) -> bool:
        """Whether horizon ``x`` (inf included) lies past the grid's largest horizon."""
        keep = np.arange(len(self.cells)) != self.on_policy
        return bool(x > self.horizons[keep].max())

    def _log_distances(self, x: float, y: float, cells: list[int]) -> np.ndarray:
        # an infinite coordinate was resolved to the grid's edge (equally far): no term
        return np.array([(0.0 if math.isinf(x) else math.log(self.horizons[i] / x)) ** 2
                         + (0.0 if math.isinf(y) else math.log(self.ratios[i] / y)) ** 2
                         for i in cells])

    def mu_of_cell(self) -> dict:
        """Each cell's own measured mu: the median of its runs' ``mu_measured``."""
        return {c: float(np.median([r.summary["mu_measured"] for r in rs]))
                for c, rs in self.runs.items()}


def probe_paths(folder: str, loss: str) -> list[str]:
    """The calibration probes in ``folder``: files ``*<loss>*.npz`` (a committed calibration)
    or the runs of a calibration sweep (``runs/*/probes.npz``, as ``predict`` makes them)."""
    paths = glob.glob(os.path.join(folder, f"*{loss}*.npz")) or \
        glob.glob(os.path.join(folder, "runs", "*", "probes.npz"))
    if not paths:
        raise ValueError(f"--calibration {folder!r} holds no probes (*{loss}*.npz or "
                         f"runs/*/probes.npz)")
    return sorted(paths)


def objectives(reg: Registration, grid: SweepGrid, calibration_dir: str, mus: dict) -> dict:
    """variant -> mu key -> (cells,) the variant's predicted objective J at each cell (the
    prediction's calibration, theory.md section 5); on-policy is the cell (1, 1)."""
    probes = load_probes(probe_paths(calibration_dir, reg.loss))
    cal = calibrate(probes, probes.counts)
    big_l, f0 = smoothness(probes)
    x, y = grid.points()
    out = {}
    for variant in reg.predictions:
        out[variant] = {}
        for key, mu in mus.items():
            pred = predict(cal, variant, mu, batch_size=grid.batch_size,
                           budget=reg.steps * (1 + mu), big_l=big_l, f0=f0,
                           extrapolate=reg.extrapolate)
            out[variant][key] = np.array([float(pred.objective(a, b)) for a, b in zip(x, y)])
    return out


def horizon_objectives(reg: Registration, grid: SweepGrid, mus: dict) -> dict:
    """readout -> mu key -> (cells,) J of a horizon-model registration (theory.md 11.5) at
    each cell: "horizon" and "horizon_vs_on_policy" from its model, "asymptotic" from section
    5's J with the same noise table; the on-policy cell as on-policy training."""
    terms, plain = hz.registered_terms(reg.horizon_model, int(max(grid.horizons)))
    on = grid.on_policy if grid.on_policy >= 0 else None
    x, y = grid.points()
    out = {}
    for variant, model in (("horizon", terms), ("horizon_vs_on_policy", terms),
                           ("asymptotic", plain)):
        if variant in reg.predictions:
            out[variant] = {key: hz.objective_at_cells(model, x, y, mu=mu, on_policy_cell=on)
                            for key, mu in mus.items()}
    return out


# the key of on-policy's regret among the predictions' (a variant name never has a space)
NO_BUFFER = "on-policy baseline"
# Issue 25's baseline: a long buffer with the replay ratio's square-root rule, written after
# seeing the first grids (every best horizon there was 64), so a bar to beat, not evidence.
RULE = "x=64, y=sqrt(mu)"
RULE_HORIZON = 64.0
# Section 5's model among the registered variants
STANDARD = "asymptotic"


def advice_cells(grid: SweepGrid, reg: Registration, mu_key: str, mu: float) -> dict:
    """name -> the cells equally near each piece of advice (``SweepGrid.equally_near``): every
    registered prediction at ``mu_key``, and the rule x = 64, y = sqrt(mu)."""
    out = {v: grid.equally_near(*reg.predictions[v][mu_key]) for v in reg.predictions
           if mu_key in reg.predictions[v]}
    out[RULE] = grid.equally_near(RULE_HORIZON, math.sqrt(mu))
    return out


def worse(regrets: list) -> int:
    """Which of equally near cells a verdict judges: the worse one, by the larger median
    regret, then the larger upper end (NaN counts as no regret); the first (the exactly
    nearest) when they are the same."""
    def key(k):
        r = regrets[k]
        return tuple(-math.inf if math.isnan(val) else val for val in (r.median, r.high))
    return max(range(len(regrets)), key=key)


def advice_record(grid: SweepGrid, cells: list, verdict, name: str) -> dict:
    """The judged cell of one piece of advice (the worse of equally near ``cells``, whose
    regrets the verdict holds as ``name|k``), its regret, the others (``tied``) and the cell the
    floating-point rule alone would take (``nearest_cell``)."""
    regrets = [verdict.regret[f"{name}|{k}"] for k in range(len(cells))]
    w = worse(regrets)
    return {"cell": grid.labels[cells[w]], "regret": regrets[w].as_dict(),
            "tied": [{"cell": grid.labels[j], "regret": regrets[k].as_dict()}
                     for k, j in enumerate(cells) if k != w],
            "nearest_cell": grid.labels[cells[0]]}


def judge_one(grid: SweepGrid, reg: Registration, measure: Measure, table: np.ndarray,
              mu_key: str, objective: dict, baseline: float, mu: float) -> dict:
    """The verdict of one (mu, measure) as a record (see the module docstring)."""
    candidates = np.ones(len(grid.cells), bool)
    advice = advice_cells(grid, reg, mu_key, mu)
    named = {f"{name}|{k}": j for name, cells in advice.items() for k, j in enumerate(cells)}
    # no buffer is the advice every prediction must beat, so its regret gets the same draws
    baseline_cell = {NO_BUFFER: grid.on_policy} if grid.on_policy >= 0 else {}
    regret = regret_gain(baseline) if measure.better == "max" else regret_ratio
    verdict = bootstrap_verdict(table, measure.better, candidates, {**named, **baseline_cell},
                                regret, objectives={v: objective[v][mu_key] for v in objective
                                                    if mu_key in objective[v]},
                                draws=reg.draws, seed=reg.rng_seed, level=reg.level)
    judged = {name: advice_record(grid, cells, verdict, name) for name, cells in advice.items()}
    gate = split_half_spearman(table, measure.better)
    best = verdict.mode
    cells = cell_records(grid, table, measure.better, verdict.p_best)
    preds = {v: {"x_star": reg.predictions[v][mu_key][0], "y_star": reg.predictions[v][mu_key][1],
                 **{k: judged[v][k] for k in ("cell", "regret")},
                 "spearman": verdict.spearman[v].as_dict() if v in verdict.spearman else None,
                 "tied": judged[v]["tied"], "nearest_cell": judged[v]["nearest_cell"],
                 "x_beyond_grid": grid.beyond_grid(reg.predictions[v][mu_key][0])}
             for v in advice if v != RULE}
    return {
        "measure": measure.name, "better": measure.better, "cells": cells,
        "best_cell": grid.labels[best], "best_probability": float(verdict.p_best[best]),
        "best_interior": interior(grid, best), "predictions": preds,
        "on_policy_regret": verdict.regret[NO_BUFFER].as_dict() if baseline_cell else None,
        "gate_spearman": gate, "gate_passed": bool(gate >= reg.threshold),
        "gate_halvings": gate_distribution(table, measure.better, seed=reg.rng_seed,
                                           level=reg.level).as_dict(),
        "seeds_per_cell": [int((~np.isnan(table[i])).any(axis=0).sum())
                           for i in range(len(grid.cells))],
        "primary_variant": reg.primary_variant,
        "baselines": {"on-policy": {"cell": "on-policy", "regret": verdict.regret[NO_BUFFER]
                                    .as_dict()} if baseline_cell else None,
                      RULE: {"x": RULE_HORIZON, "y": math.sqrt(mu), **judged[RULE]},
                      "section 5": {"variant": STANDARD, "cell": preds[STANDARD]["cell"],
                                    "regret": preds[STANDARD]["regret"]}
                      if STANDARD in preds else None},
        "best_horizon": best_horizon(grid, table, measure.better, verdict, reg.level),
        "within_noise": within_noise(grid, verdict)}


def cell_records(grid: SweepGrid, table: np.ndarray, better: str, p_best: np.ndarray) -> list:
    """Per cell: median at the best lr, that lr, whether it is an edge of the cell's lrs."""
    best, idx = best_option(table, better)
    out = []
    for i, label in enumerate(grid.labels):
        have = np.flatnonzero((~np.isnan(table[i])).any(axis=1))  # lrs this cell ran
        if idx[i] < 0:
            continue
        j = int(idx[i])
        out.append({"label": label, "horizon": float(grid.horizons[i]),
                    "replay_ratio": float(grid.ratios[i]), "score": float(best[i]),
                    "lr": grid.lrs[j], "lr_at_edge": bool(j in (have[0], have[-1])),
                    "p_best": float(p_best[i])})
    return out


def interior(grid: SweepGrid, i: int) -> dict:
    """Whether cell ``i`` lies strictly inside the measured grid in x and in y (on-policy:
    neither)."""
    if i == grid.on_policy:
        return {"x": False, "y": False}
    keep = np.arange(len(grid.cells)) != grid.on_policy
    hs, ys = grid.horizons[keep], grid.ratios[keep]
    return {"x": bool(hs.min() < grid.horizons[i] < hs.max()),
            "y": bool(ys.min() < grid.ratios[i] < ys.max())}


def complete_seeds(runs: list[Run]) -> list[Run]:
    """The runs of the seeds that finished every (cell, learning rate) any seed finished.

    An interim verdict of a sweep still running (seed-major) uses these, so that no cell's
    median rests on fewer seeds than another's."""
    done = {}
    for r in runs:
        done.setdefault(r.seed, set()).add((r.cell, r.lr))
    every = set().union(*done.values()) if done else set()
    keep = {s for s, have in done.items() if have == every}
    return [r for r in runs if r.seed in keep]


def load_grid_runs(curves, loss: str) -> list[Run]:
    """The runs of loss ``loss`` in one ``curves.jsonl`` or several (a grid and its registered
    extension, e.g. ``cpu_sweep_v2``'s x = 256); ValueError if two files hold the same
    (cell, learning rate, seed), which would otherwise overwrite each other silently, or if
    the runs started from different warm starts (``results.same_warm_start``)."""
    paths = [curves] if isinstance(curves, str) else list(curves)
    runs, seen = [], {}
    for path in paths:
        for r in load_runs(path):
            if r.get("trainer.loss", loss) != loss:
                continue
            key = (r.cell, r.lr, r.seed)
            if key in seen:
                raise ValueError(f"run {r.run_id} ({path}) repeats {seen[key]}: the same "
                                 f"cell, lr {r.lr:g} and seed {r.seed}")
            seen[key] = f"{r.run_id} ({path})"
            runs.append(r)
    first = runs[0] if runs else None
    other = [r for r in runs if not same_warm_start(first.summary, r.summary)]
    if other:  # seeds are exchangeable draws only from one initial policy
        raise ValueError(
            f"the grid mixes initial policies: {len(other)} of {len(runs)} runs (e.g. "
            f"{other[0].run_id}, step-0 accuracy {other[0].summary.get('warm_start_accuracy')})"
            f" differ from {first.run_id} (step-0 accuracy "
            f"{first.summary.get('warm_start_accuracy')}); judge each policy's runs apart")
    return runs


def judge(curves, reg: Registration, calibration_dir: str | None,
          only_complete_seeds: bool = False, wall_clock: bool = False) -> list[dict]:
    """All verdicts of a registered sweep: one record per (mu, measure); see the module
    docstring. ``curves``: a ``curves.jsonl`` path or a list of them (``load_grid_runs``).
    ``calibration_dir``: the probes the predictions came from (for the Spearman of
    each prediction's objective; None = no Spearman). ``only_complete_seeds``: judge only the
    seeds that finished every run (``complete_seeds``), for an interim verdict.
    ``wall_clock``: add the measured-seconds record (as ``reg.wall_clock`` does)."""
    runs = load_grid_runs(curves, reg.loss)
    read = [{"path": path, "sha256": file_sha256(path)}  # what provenance.py orders against
            for path in ([curves] if isinstance(curves, str) else curves)]
    if only_complete_seeds:
        runs = complete_seeds(runs)
    if not runs:
        raise ValueError(f"{curves} holds no finished run of loss {reg.loss!r}"
                         + (" in a complete seed" if only_complete_seeds else ""))
    if reg.warm_start and not same_warm_start(reg.warm_start, runs[0].summary):
        raise ValueError(f"the runs started from another policy than the registration's "
                         f"calibration ({runs[0].run_id}: step-0 accuracy "
                         f"{runs[0].summary.get('warm_start_accuracy')}, registration "
                         f"{reg.warm_start.get('warm_start_accuracy')}): the prediction is not "
                         "about these runs; pin the policy (model.warm_start_path)")
    grid = SweepGrid.of(runs)
    if len(grid.seeds) < 2:
        raise ValueError(f"a verdict needs at least 2 seeds (the seed bootstrap and the "
                         f"split-half gate resample them); {curves} has seeds {grid.seeds}"
                         + (" complete" if only_complete_seeds else ""))
    onp = grid.runs[grid.cells[grid.on_policy]] if grid.on_policy >= 0 else runs
    mus = {MEASURED: float(np.median([r.summary["mu_measured"] for r in onp])),
           **{f"{m:g}": m for m in reg.accounting_mus}}
    obj = objectives(reg, grid, calibration_dir, mus) if calibration_dir else {}
    if reg.horizon_model is not None:
        obj.update(horizon_objectives(reg, grid, mus))
    baseline = float(np.median([r.eval["eval_accuracy"][0] for r in runs]))
    cell_mu = grid.mu_of_cell()

    def budget(mu):
        return reg.steps * (1 + mu / reg.budget_replay_ratio)

    records = []
    for key, mu in [*mus.items(), (CELL_MU, mus[MEASURED])]:
        pred_key = MEASURED if key == CELL_MU else key
        mu_run = (lambda r: cell_mu[r.cell]) if key == CELL_MU else (lambda r, mu=mu: mu)
        for m in measures(reg, budget):
            table = grid.table(lambda r: m.score(r, mu_run(r)))
            rec = judge_one(grid, reg, m, table, pred_key, obj, baseline, mu)
            if m.name == "auc":
                def to_target(r, a, f=mu_run):
                    return r.compute_to_target(f(r), a)
                rec["compute_to_target"] = compute_to_target(
                    grid, rec, target_tables(grid, reg, rec, to_target, baseline),
                    reg.draws, reg.rng_seed, reg.level)
            records.append({"mu": mu, "mu_source": key, "budget": budget(mu)
                            if m.name == "auc" else None, "seeds": grid.seeds,
                            "registration": {"path": reg.path, "sha256": reg.sha256},
                            "curves": read, **rec})
    if wall_clock or reg.wall_clock:
        records.append({"mu": mus[MEASURED], "mu_source": SECONDS, "seeds": grid.seeds,
                        "registration": {"path": reg.path, "sha256": reg.sha256},
                        "curves": read, **seconds_record(grid, reg, obj, baseline,
                                                         mus[MEASURED])})
    return records


def seconds_record(grid: SweepGrid, reg: Registration, objective: dict, baseline: float,
                   mu: float) -> dict:
    """The verdict in measured seconds (see the module docstring): AUC over seconds in
    [0, ``seconds.seconds_budget``], predictions and the rule at the measured ``mu``,
    seconds to target, and the cells' costs in the unit C (``costs``)."""
    budget = seconds_budget(grid)
    m = Measure("auc_seconds", "max", lambda r, mu: mean_over_budget(
        seconds_at_evals(r), r.eval["eval_accuracy"], budget))
    rec = judge_one(grid, reg, m, grid.table(lambda r: m.score(r, mu)), MEASURED, objective,
                    baseline, mu)
    rec["compute_to_target"] = compute_to_target(
        grid, rec, target_tables(grid, reg, rec, lambda r, a: curve_to_target(
            seconds_at_evals(r), r.eval["eval_accuracy"], a, interpolate=True), baseline),
        reg.draws, reg.rng_seed, reg.level)
    return {"budget": budget, "budget_unit": "seconds", **rec, "costs": cell_costs(grid)}


def target_tables(grid: SweepGrid, reg: Registration, record: dict, to_target,
                  warm_start: float) -> list:
    """(target accuracy, (cells, lrs, seeds) ``to_target(run, accuracy)``: compute or seconds
    to first reach it) pairs: the registration's ``compute_targets``, else
    ``best_region.default_targets`` from the AUC verdict ``record``'s best cell."""
    best = grid.labels.index(record["best_cell"])
    lr = next(c["lr"] for c in record["cells"] if c["label"] == record["best_cell"])
    targets = reg.compute_targets or default_targets(grid, best, lr, warm_start)
    return [(a, grid.table(lambda r, a=a: to_target(r, a))) for a in targets]


def main(argv=None) -> int:
    """``python -m llm_experiments.judge --curves C [C ...] --registration R [--calibration D]
    --out validation.json``: the verdicts, and a table of them on the terminal."""
    p = Parser(prog="llm_experiments judge", description=__doc__.splitlines()[0])
    p.add_argument("--curves", type=existing_file, required=True, nargs="+",
                   help="compacted sweep (curves.jsonl); several files are judged as one grid")
    p.add_argument("--registration", type=existing_file, required=True,
                   help="preregistration.json")
    p.add_argument("--calibration", help="probes of the judged predictions (*<loss>*.npz)")
    p.add_argument("--out", type=output_file, required=True, help="validation.json to write")
    p.add_argument("--complete-seeds", action="store_true", help="judge only the seeds that "
                   "finished every run (an interim verdict of a sweep still running)")
    p.add_argument("--seconds", action="store_true", help="also judge over measured seconds "
                   "(the auc_seconds record; theory.md section 3.7)")
    a = p.parse_args(argv)
    try:
        records = judge(a.curves, Registration.load(a.registration), a.calibration,
                        only_complete_seeds=a.complete_seeds, wall_clock=a.seconds)
    except ValueError as exc:
        return p.report(exc)
    write_json(a.out, records)
    for r in records:
        preds = "; ".join(f"{v} {d['cell']} regret {d['regret']['median']:.2f} "
                          f"[{d['regret']['low']:.2f}, {d['regret']['high']:.2f}]"
                          for v, d in r["predictions"].items())
        print(f"mu {r['mu_source']:>8s}={r['mu']:.3g} {r['measure']:>12s}: best "
              f"{r['best_cell']} (p={r['best_probability']:.2f}), gate "
              f"{r['gate_spearman']:.2f} | {preds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
