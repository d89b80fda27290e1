"""Judge a pre-registered sweep: seed-bootstrap verdicts on where the optimum is and how each
prediction fares (theory.md section 8).

The registration (``preregistration.json``, committed before the sweep's runs) fixes the grid,
the primary measure, the secondary targets, the bootstrap and the predictions to judge. For
each mu (the measured one, the accounting values, and each cell's own measured mu) and each
measure, ``judge`` writes one record: every cell's median score at its best learning rate and
its probability of being best, the bootstrap-mode best cell, whether it is interior to the
grid, each prediction's nearest cell with its regret (median and interval; a cell equally
near, as x* = 8 is to horizons 4 and 16, is reported beside it with its own), the Spearman of
each prediction's objective J with the measured scores (interval), on-policy's regret (the
no-buffer advice a prediction must beat; None for a grid without it), the split-half gate, the
registration judged and the curves files read (path and sha256 of the bytes of each, to find
in git history: ``provenance.py``).

Measures: ``auc`` (primary, higher is better): mean accuracy over compute in [0, C(mu)],
C(mu) = steps (1 + mu / y_max), the compute the cheapest cell spends in the run
(``replaytheory.analysis.mean_over_budget``); ``target=a`` (lower is better): compute to
first reach accuracy a.

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
from replaytheory.analysis import best_option, mean_over_budget, split_half_spearman
from replaytheory.checks import choice
from replaytheory.cli_input import (BadInput, Parser, existing_file, file_label, missing_field,
                                    one_line, output_file, read_json)
from replaytheory.io import write_json
from replaytheory.noise import EXTRAPOLATIONS
from replaytheory.verdicts import bootstrap_verdict, gate_distribution, regret_gain, regret_ratio

from .cells import kind, xy
from .results import Run, by_cell, load_runs, same_warm_start
from .validation import VARIANTS, load_probes, predict, smoothness

# what ``Registration.load`` reads, for its error messages
REGISTRATION = "a registration (predict's prediction.json or a preregistration.json)"
MEASURED = "measured"
CELL_MU = "cell"


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
                if isinstance(by_mu, dict) and variant in VARIANTS:
                    preds[variant] = {_mu_key(k, acc): tuple(xy_) for k, xy_ in by_mu.items()
                                      if isinstance(xy_, list)}
            return cls(d["name"], d["loss"], int(d["steps"]), tuple(d["horizons"]),
                       tuple(d["replay_ratios"]), acc,
                       float(d["primary_measure"]["budget_replay_ratio"]),
                       tuple(d.get("secondary_targets", ())), int(d["bootstrap"]["draws"]),
                       float(d["bootstrap"]["interval"]), int(d["bootstrap"]["rng_seed"]),
                       float(d["gate"]["threshold"]), preds, d.get("extrapolate", "none"),
                       path, file_sha256(path), d.get("warm_start"))
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

    def nearest(self, x: float, y: float) -> int:
        """The grid cell nearest (x, y) in (log x, log y); on-policy if x < 1 (the
        prediction is on-policy: a horizon under one step). Of cells at the same distance up
        to rounding (``tied``), the exactly nearest in floating point (the registered rule)."""
        if x < 1 and self.on_policy >= 0:
            return self.on_policy
        grid = [i for i in range(len(self.cells)) if i != self.on_policy]
        return grid[int(np.argmin(self._log_distances(x, y, grid)))]

    def tied(self, x: float, y: float) -> list[int]:
        """The other cells as near (x, y) as ``nearest`` up to rounding (relative 1e-9), e.g.
        x* = 8 between horizons 4 and 16: their regrets are reported beside the verdict's."""
        first = self.nearest(x, y)
        if first == self.on_policy:
            return []
        grid = [i for i in range(len(self.cells)) if i != self.on_policy]
        d = self._log_distances(x, y, grid)
        return [i for i, di in zip(grid, d) if i != first
                and math.isclose(di, d.min(), rel_tol=1e-9, abs_tol=1e-12)]

    def _log_distances(self, x: float, y: float, cells: list[int]) -> np.ndarray:
        return np.array([(math.log(self.horizons[i] / x)) ** 2
                         + (math.log(self.ratios[i] / y)) ** 2 for i in cells])

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
    x = np.where(np.arange(len(grid.cells)) == grid.on_policy, 1.0, grid.horizons)
    y = np.where(np.arange(len(grid.cells)) == grid.on_policy, 1.0, grid.ratios)
    out = {}
    for variant in reg.predictions:
        out[variant] = {}
        for key, mu in mus.items():
            pred = predict(cal, variant, mu, batch_size=grid.batch_size,
                           budget=reg.steps * (1 + mu), big_l=big_l, f0=f0,
                           extrapolate=reg.extrapolate)
            out[variant][key] = np.array([float(pred.objective(a, b)) for a, b in zip(x, y)])
    return out


# the key of on-policy's regret among the predictions' (a variant name never has a space)
NO_BUFFER = "on-policy baseline"


def judge_one(grid: SweepGrid, reg: Registration, measure: Measure, table: np.ndarray,
              mu_key: str, objective: dict, baseline: float) -> dict:
    """The verdict of one (mu, measure) as a record (see the module docstring)."""
    candidates = np.ones(len(grid.cells), bool)
    preds = {v: grid.nearest(*reg.predictions[v][mu_key]) for v in reg.predictions
             if mu_key in reg.predictions[v]}
    tied = {v: {f"{v} tie {k}": j for k, j in enumerate(grid.tied(*reg.predictions[v][mu_key]))}
            for v in preds}
    ties = {t: j for by_v in tied.values() for t, j in by_v.items()}
    # no buffer is the advice every prediction must beat, so its regret gets the same draws
    baseline_cell = {NO_BUFFER: grid.on_policy} if grid.on_policy >= 0 else {}
    regret = regret_gain(baseline) if measure.better == "max" else regret_ratio
    verdict = bootstrap_verdict(table, measure.better, candidates,
                                {**preds, **ties, **baseline_cell}, regret,
                                objectives={v: objective[v][mu_key] for v in objective
                                            if mu_key in objective[v]},
                                draws=reg.draws, seed=reg.rng_seed, level=reg.level)
    gate = split_half_spearman(table, measure.better)
    best = verdict.mode
    return {
        "measure": measure.name, "better": measure.better,
        "cells": cell_records(grid, table, measure.better, verdict.p_best),
        "best_cell": grid.labels[best], "best_probability": float(verdict.p_best[best]),
        "best_interior": interior(grid, best),
        "predictions": {v: {"x_star": reg.predictions[v][mu_key][0],
                            "y_star": reg.predictions[v][mu_key][1],
                            "cell": grid.labels[i], "regret": verdict.regret[v].as_dict(),
                            "spearman": verdict.spearman[v].as_dict()
                            if v in verdict.spearman else None,
                            "tied": [{"cell": grid.labels[j], "regret": verdict.regret[t].as_dict()}
                                     for t, j in tied[v].items()]}
                      for v, i in preds.items()},
        "on_policy_regret": verdict.regret[NO_BUFFER].as_dict() if baseline_cell else None,
        "gate_spearman": gate, "gate_passed": bool(gate >= reg.threshold),
        "gate_halvings": gate_distribution(table, measure.better, seed=reg.rng_seed,
                                           level=reg.level).as_dict(),
        "seeds_per_cell": [int((~np.isnan(table[i])).any(axis=0).sum())
                           for i in range(len(grid.cells))]}


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
          only_complete_seeds: bool = False) -> list[dict]:
    """All verdicts of a registered sweep: one record per (mu, measure); see the module
    docstring. ``curves``: a ``curves.jsonl`` path or a list of them (``load_grid_runs``).
    ``calibration_dir``: the probes the predictions came from (for the Spearman of
    each prediction's objective; None = no Spearman). ``only_complete_seeds``: judge only the
    seeds that finished every run (``complete_seeds``), for an interim verdict."""
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
    baseline = float(np.median([r.eval["eval_accuracy"][0] for r in runs]))
    cell_mu = grid.mu_of_cell()

    def budget(mu):
        return reg.steps * (1 + mu / reg.budget_replay_ratio)

    records = []
    for key, mu in [*mus.items(), (CELL_MU, mus[MEASURED])]:
        pred_key = MEASURED if key == CELL_MU else key
        for m in measures(reg, budget):
            mu_run = (lambda r: cell_mu[r.cell]) if key == CELL_MU else (lambda r, mu=mu: mu)
            table = grid.table(lambda r: m.score(r, mu_run(r)))
            rec = judge_one(grid, reg, m, table, pred_key, obj, baseline)
            records.append({"mu": mu, "mu_source": key, "budget": budget(mu)
                            if m.name == "auc" else None, "seeds": grid.seeds,
                            "registration": {"path": reg.path, "sha256": reg.sha256},
                            "curves": read, **rec})
    return records


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
    a = p.parse_args(argv)
    try:
        records = judge(a.curves, Registration.load(a.registration), a.calibration,
                        only_complete_seeds=a.complete_seeds)
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
