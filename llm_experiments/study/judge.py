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
(``replaytheory.stats.analysis.mean_over_budget``); ``target=a`` (lower is better): compute to
first reach accuracy a.

In measured seconds (``--seconds``, or ``"wall_clock": true`` in the registration; issue 27,
theory.md section 3.7): one more record, ``measure`` "auc_seconds", ``mu_source``
"seconds": mean accuracy over each run's own measured seconds (``seconds.RunCosts``) in
[0, the cheapest cell's median run seconds] (``budget``, seconds), its predictions and rule
judged at the measured mu, seconds to the two targets (``compute_to_target``, in seconds),
and every cell's update cost and mu in the unit C = an on-policy update of B rollouts
(``costs``, ``seconds.cell_costs``). The compute-unit records are unchanged.

``python -m llm_experiments.study.judge --curves results/cpu_sweep_v2/curves.jsonl
--registration results/cpu_sweep_v2/preregistration.json --calibration
results/cpu_sweep/calibration --out results/cpu_sweep_v2/validation.json``
"""

from __future__ import annotations

import glob
import hashlib
import math
import os
from dataclasses import MISSING, dataclass, field, fields

import numpy as np

from replaytheory.model import horizon as hz
from replaytheory.model import window as wn
from replaytheory.stats.analysis import (best_option, compute_to_target as curve_to_target,
                                         mean_over_budget, split_half_spearman)
from replaytheory import checks
from replaytheory.checks import choice
from replaytheory.cli_input import (BadInput, Parser, existing_file, file_label, missing_field,
                                    one_line, output_file, read_json)
from replaytheory.io import write_json
from replaytheory.model.noise import EXTRAPOLATIONS
from replaytheory.stats.verdicts import (TIE_RTOL, bootstrap_verdict, gate_distribution,
                                         regret_gain, regret_ratio)

from .best_region import best_horizon, compute_to_target, default_targets, within_noise
from .cells import kind, xy
from .results import Run, by_cell, load_runs, same_warm_start
from .seconds import cell_costs, seconds_at_evals, seconds_budget
from .validation import HORIZON_VARIANTS, VARIANTS, ProbeFit, predict

# what ``Registration.load`` reads, for its error messages
REGISTRATION = "a registration (predict's prediction.json or a preregistration.json)"
MEASURED = "measured"
CELL_MU = "cell"
SECONDS = "seconds"  # the mu_source of the wall-clock record
JUDGED_VARIANTS = (*VARIANTS, *HORIZON_VARIANTS)


_REQUIRED = object()


def _from(key: str, check, *args, default=_REQUIRED, **kwargs):
    """A ``Registration`` field read from ``key`` of the file (dotted: a field of a block,
    e.g. "bootstrap.draws") through ``check(key, value, *args, **kwargs)``, which returns the
    value and raises ValueError naming ``key`` and its allowed range (``replaytheory.checks``);
    a file without ``key`` gives ``default`` (none: the field is required)."""
    meta = {"key": key, "check": lambda name, value: check(name, value, *args, **kwargs)}
    return field(metadata=meta) if default is _REQUIRED else field(default=default,
                                                                   metadata=meta)


def _text(name: str, value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}")
    return value


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def _object_or_none(name: str, value) -> dict | None:
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"{name} must be an object or null, got {value!r}")
    return value


def _variant_or_none(name: str, value) -> str | None:
    return None if value is None else choice(name, value, JUDGED_VARIANTS)


def _each(check, *args, **kwargs):
    """``check`` applied to every value of a list (named ``name[i]`` in its message)."""
    def every(name: str, values) -> tuple:
        if not isinstance(values, list):
            raise ValueError(f"{name} must be a list, got {values!r}")
        return tuple(check(f"{name}[{i}]", v, *args, **kwargs) for i, v in enumerate(values))
    return every


def _point(name: str, value) -> tuple:
    """A prediction [x*, y*] as written: x* >= 0 (< 1 is on-policy), y* > 0, inf allowed
    (``SweepGrid.equally_near``); the numbers are kept as the file has them (a verdict
    record repeats x*)."""
    if not (isinstance(value, list) and len(value) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
            and value[0] >= 0 and value[1] > 0):
        raise ValueError(f"{name} must be [x*, y*] with x* >= 0 and y* > 0, got {value!r}")
    return tuple(value)


def _judged(name: str, by_variant) -> dict:
    """variant -> {mu (a float): (x*, y*)} of the variants the judge scores; a variant without
    an optimum at some mu carries the reason there (a string), which is left out."""
    if not isinstance(by_variant, dict):
        raise ValueError(f"{name} must be an object (variant -> mu -> [x*, y*]), got "
                         f"{by_variant!r}")
    out = {}
    for variant, by_mu in by_variant.items():
        if isinstance(by_mu, dict) and variant in JUDGED_VARIANTS:
            out[variant] = {_mu(f"{name}.{variant}", key): _point(f"{name}.{variant}.{key}", xy_)
                            for key, xy_ in by_mu.items() if isinstance(xy_, list)}
    return out


def _mu(name: str, key: str) -> float:
    try:
        return float(key)
    except ValueError:
        raise ValueError(f"{name}: the key {key!r} must be a mu (a number)") from None


@dataclass(frozen=True)
class Registration:
    """What a pre-registration fixes (fields of ``preregistration.json``): each field below
    names the file's field it is read from and its allowed range (``load``)."""

    name: str = _from("name", _text)
    loss: str = _from("loss", _text)
    steps: int = _from("steps", checks.integer, 1)
    horizons: tuple = _from("horizons", _each(checks.positive))
    replay_ratios: tuple = _from("replay_ratios", _each(checks.positive))
    accounting_mus: tuple = _from("accounting_mus", _each(checks.positive))
    budget_replay_ratio: float = _from("primary_measure.budget_replay_ratio", checks.positive)
    draws: int = _from("bootstrap.draws", checks.integer, 1)
    level: float = _from("bootstrap.interval", checks.real, 0.0, 1.0, lo_open=True,
                         hi_open=True)
    rng_seed: int = _from("bootstrap.rng_seed", checks.integer, 0)
    threshold: float = _from("gate.threshold", checks.real, -1.0, 1.0)
    # variant -> {mu key: (x*, y*)}; the key of an accounting mu is f"{mu:g}", any other mu's
    # is "measured" (``load``)
    predictions: dict = _from("predictions_judged", _judged)
    # the secondary measures' accuracies (compute to first reach each)
    targets: tuple = _from("secondary_targets", _each(checks.unit_interval), default=())
    # how the predictions' noise table reached past its range
    extrapolate: str = _from("extrapolate", choice, EXTRAPOLATIONS, default="none")
    # Which file, byte for byte, the verdicts judge: git history can then show that this
    # exact registration was committed before the runs.
    path: str = ""
    sha256: str = ""
    # The calibration's initial policy ({"warm_start_sha256", "warm_start_accuracy"}; None in
    # registrations from before predict recorded it): the grid's runs must share it.
    warm_start: dict | None = _from("warm_start", _object_or_none, default=None)
    # The registered primary variant (None in registrations without one) and the accuracies
    # of the compute-to-target comparison beside AUC (empty: ``best_region.default_targets``)
    primary_variant: str | None = _from("primary_variant", _variant_or_none, default=None)
    compute_targets: tuple = _from("compute_targets", _each(checks.unit_interval), default=())
    # Also judge in measured seconds (the "auc_seconds" record; ``--seconds`` sets it too)
    wall_clock: bool = _from("wall_clock", _flag, default=False)
    # A horizon-model registration's record (``horizon_predict``): its J per cell comes from
    # the panel fit it holds, not from a calibration folder
    horizon_model: dict | None = _from("horizon_model", _object_or_none, default=None)

    @classmethod
    def load(cls, path: str, flag: str = "--registration") -> Registration:
        """Read a registration file; ``BadInput`` names ``flag``, the file and the field that
        is missing or wrong (unreadable, not JSON, a field missing, of the wrong type or out
        of its range)."""
        doc = read_json(path, flag)
        values = {}
        for f in fields(cls):
            if "key" not in f.metadata:
                continue
            try:
                values[f.name] = f.metadata["check"](f.metadata["key"],
                                                     _field_of(doc, f.metadata["key"]))
            except KeyError as exc:
                if f.default is MISSING:
                    raise missing_field(exc, path, flag, REGISTRATION) from None
            except ValueError as exc:
                raise BadInput(f"{file_label(path, flag)}: {one_line(exc)}; expected "
                               f"{REGISTRATION}") from None
        values["predictions"] = {
            variant: {f"{mu:g}" if mu in values["accounting_mus"] else MEASURED: xy_
                      for mu, xy_ in by_mu.items()}
            for variant, by_mu in values["predictions"].items()}
        return cls(**values, path=path, sha256=file_sha256(path))

    def compute_budget(self, mu: float) -> float:
        """The AUC's budget C(mu) = steps (1 + mu / y_max) in trainer updates: the compute the
        cheapest cell (the largest replay ratio y_max = ``budget_replay_ratio``) spends."""
        return self.steps * (1 + mu / self.budget_replay_ratio)


def _field_of(doc: dict, key: str):
    """The value at the dotted ``key`` of a registration; KeyError names the missing part,
    ValueError a block that is not an object."""
    value, parts = doc, key.split(".")
    for depth, part in enumerate(parts):
        if depth and not isinstance(value, dict):
            raise ValueError(f"{'.'.join(parts[:depth])} must be an object, got {value!r}")
        value = value[part]
    return value


def file_sha256(path: str) -> str:
    """The sha256 (hex) of a file's bytes: what a verdict record names it by."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


@dataclass(frozen=True)
class Measure:
    """A way to score a run at given mus: name, better ("max"/"min") and the score."""

    name: str
    better: str
    score: object  # (run, mu) -> float


def measures(reg: Registration) -> list[Measure]:
    """The primary measure (AUC over the budget ``reg.compute_budget(mu)``) and the targets."""
    out = [Measure("auc", "max", lambda r, mu: mean_over_budget(
        r.compute(mu), r.eval["eval_accuracy"], reg.compute_budget(mu)))]
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
        return cls(cells=cells, runs=groups, labels=labels,
                   horizons=np.array([p[0] for p in pts]), ratios=np.array([p[1] for p in pts]),
                   on_policy=onp, lrs=sorted({r.lr for r in members}),
                   seeds=sorted({r.seed for r in members}), batch_size=members[0].batch_size)

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
    fit = ProbeFit.of(probe_paths(calibration_dir, reg.loss))
    x, y = grid.points()
    out = {}
    for variant in reg.predictions:
        out[variant] = {}
        for key, mu in mus.items():
            pred = predict(fit, variant, mu, batch_size=grid.batch_size,
                           budget=reg.steps * (1 + mu), extrapolate=reg.extrapolate)
            out[variant][key] = np.array([float(pred.objective(a, b)) for a, b in zip(x, y)])
    return out


def horizon_objectives(reg: Registration, grid: SweepGrid, mus: dict) -> dict:
    """readout -> mu key -> (cells,) J of a horizon-model registration at each cell: of a
    window registration (``window_predict``, theory.md 11.12) J_T over its ``steps`` updates,
    "horizon" with the panels' phases and "horizon_one_phase" with their pooled fit;
    otherwise (11.5) "horizon" and "horizon_vs_on_policy" from its model; "asymptotic" from
    section 5's J with the same noise table; the on-policy cell as on-policy training."""
    longest = int(max(grid.horizons))
    on = grid.on_policy if grid.on_policy >= 0 else None
    x, y = grid.points()
    out = {}
    if "window" in reg.horizon_model:
        phased, one = wn.registered_window(reg.horizon_model, longest)
        models = (("horizon", phased), ("horizon_one_phase", one))
        for variant, model in models:
            if variant in reg.predictions:
                tab = wn.step_tables(model, reg.steps)
                out[variant] = {key: wn.objective_at_cells(tab, x, y, mu=mu,
                                                           y_max=reg.budget_replay_ratio,
                                                           on_policy_cell=on)
                                for key, mu in mus.items()}
        plain = hz.section5_terms(one.terms[0])
    else:
        terms, plain = hz.registered_terms(reg.horizon_model, longest)
        for variant in ("horizon", "horizon_vs_on_policy"):
            if variant in reg.predictions:
                out[variant] = {key: hz.objective_at_cells(terms, x, y, mu=mu, on_policy_cell=on)
                                for key, mu in mus.items()}
    if "asymptotic" in reg.predictions:
        out["asymptotic"] = {key: hz.objective_at_cells(plain, x, y, mu=mu, on_policy_cell=on)
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


@dataclass(frozen=True)
class JudgedSweep:
    """What every verdict of one judged sweep shares: its grid, its registration, each judged
    variant's objective J per cell (variant -> mu key -> (cells,); empty without the
    prediction's calibration) and the warm start (median step-0 accuracy in [0, 1]: the zero
    of the AUC's regret, ``regret_gain``)."""

    grid: SweepGrid
    reg: Registration
    objectives: dict
    warm_start: float


def judge_one(s: JudgedSweep, measure: Measure, table: np.ndarray, *, mu_key: str,
              mu: float) -> dict:
    """The verdict of one (mu, measure) as a record (see the module docstring): ``table`` the
    (cells, lrs, seeds) scores, ``mu_key`` the key of the judged predictions, ``mu`` the
    rule's (y = sqrt(mu))."""
    grid, reg = s.grid, s.reg
    advice = advice_cells(grid, reg, mu_key, mu)
    verdict = bootstrap(s, measure, table, advice, mu_key)
    judged = {name: advice_record(grid, cells, verdict, name) for name, cells in advice.items()}
    preds = {v: prediction_record(grid, reg.predictions[v][mu_key], judged[v],
                                  verdict.spearman.get(v))
             for v in advice if v != RULE}
    gate = split_half_spearman(table, measure.better)
    best = verdict.mode
    has_on_policy = grid.on_policy >= 0
    return {
        "measure": measure.name, "better": measure.better,
        "cells": cell_records(grid, table, measure.better, verdict.p_best),
        "best_cell": grid.labels[best], "best_probability": float(verdict.p_best[best]),
        "best_interior": interior(grid, best), "predictions": preds,
        "on_policy_regret": verdict.regret[NO_BUFFER].as_dict() if has_on_policy else None,
        "gate_spearman": gate, "gate_passed": bool(gate >= reg.threshold),
        "gate_halvings": gate_distribution(table, measure.better, seed=reg.rng_seed,
                                           level=reg.level).as_dict(),
        "seeds_per_cell": [int((~np.isnan(table[i])).any(axis=0).sum())
                           for i in range(len(grid.cells))],
        "primary_variant": reg.primary_variant,
        "baselines": baseline_records(verdict, judged, preds, mu, has_on_policy),
        "best_horizon": best_horizon(grid, table, measure.better, verdict, reg.level),
        "within_noise": within_noise(grid, verdict)}


def bootstrap(s: JudgedSweep, measure: Measure, table: np.ndarray, advice: dict,
              mu_key: str):
    """The seed-bootstrap verdict of ``table``: every piece of advice's equally near cells
    (``advice_cells``, named ``name|k``) and on-policy's (``NO_BUFFER``) judged in the same
    draws, and each variant's J at ``mu_key`` ranked against the scores (Spearman)."""
    named = {f"{name}|{k}": j for name, cells in advice.items() for k, j in enumerate(cells)}
    if s.grid.on_policy >= 0:  # no buffer is the advice every prediction must beat
        named[NO_BUFFER] = s.grid.on_policy
    regret = regret_gain(s.warm_start) if measure.better == "max" else regret_ratio
    return bootstrap_verdict(table, measure.better, np.ones(len(s.grid.cells), bool), named,
                             regret, objectives={v: by_mu[mu_key]
                                                 for v, by_mu in s.objectives.items()
                                                 if mu_key in by_mu},
                             draws=s.reg.draws, seed=s.reg.rng_seed, level=s.reg.level)


def prediction_record(grid: SweepGrid, point: tuple, judged: dict, spearman) -> dict:
    """One registered prediction's verdict: (x*, y*) as registered (``point``), its judged
    cell and regret with the equally near cells (``advice_record``), the Spearman of its J
    with the measured scores (an interval; None without its J) and whether x* lies past the
    grid's largest horizon."""
    return {"x_star": point[0], "y_star": point[1], "cell": judged["cell"],
            "regret": judged["regret"],
            "spearman": spearman.as_dict() if spearman is not None else None,
            "tied": judged["tied"], "nearest_cell": judged["nearest_cell"],
            "x_beyond_grid": grid.beyond_grid(point[0])}


def baseline_records(verdict, judged: dict, preds: dict, mu: float,
                     has_on_policy: bool) -> dict:
    """The three baselines in the verdict's draws: on-policy (None without its cell), the rule
    x = 64, y = sqrt(mu) (``judged[RULE]``) and section 5's model (None unless registered)."""
    return {"on-policy": {"cell": "on-policy", "regret": verdict.regret[NO_BUFFER].as_dict()}
            if has_on_policy else None,
            RULE: {"x": RULE_HORIZON, "y": math.sqrt(mu), **judged[RULE]},
            "section 5": {"variant": STANDARD, "cell": preds[STANDARD]["cell"],
                          "regret": preds[STANDARD]["regret"]} if STANDARD in preds else None}


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
    runs = judged_runs(curves, reg, only_complete_seeds)
    grid = SweepGrid.of(runs)
    if len(grid.seeds) < 2:
        raise ValueError(f"a verdict needs at least 2 seeds (the seed bootstrap and the "
                         f"split-half gate resample them); {curves} has seeds {grid.seeds}"
                         + (" complete" if only_complete_seeds else ""))
    mus = sweep_mus(grid, runs, reg)
    obj = objectives(reg, grid, calibration_dir, mus) if calibration_dir else {}
    if reg.horizon_model is not None:
        obj.update(horizon_objectives(reg, grid, mus))
    s = JudgedSweep(grid=grid, reg=reg, objectives=obj,
                    warm_start=float(np.median([r.eval["eval_accuracy"][0] for r in runs])))
    # what provenance.py orders against each other in git history
    read = {"registration": {"path": reg.path, "sha256": reg.sha256},
            "curves": [{"path": path, "sha256": file_sha256(path)}
                       for path in ([curves] if isinstance(curves, str) else curves)]}
    records = [{**r, "seeds": grid.seeds, **read, **rec}
               for r, rec in compute_verdicts(s, mus)]
    if wall_clock or reg.wall_clock:
        records.append({"mu": mus[MEASURED], "mu_source": SECONDS, "seeds": grid.seeds, **read,
                        **seconds_record(s, mus[MEASURED])})
    return records


def judged_runs(curves, reg: Registration, only_complete_seeds: bool) -> list[Run]:
    """The runs ``judge`` scores (``load_grid_runs``, with ``only_complete_seeds`` those of
    ``complete_seeds``); ValueError if there are none or they started from another policy
    than the registration's calibration."""
    runs = load_grid_runs(curves, reg.loss)
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
    return runs


def sweep_mus(grid: SweepGrid, runs: list[Run], reg: Registration) -> dict:
    """mu key -> mu: ``MEASURED`` the median ``mu_measured`` of the on-policy runs (of every
    run in a grid without on-policy), and each accounting mu under f"{mu:g}"."""
    onp = grid.runs[grid.cells[grid.on_policy]] if grid.on_policy >= 0 else runs
    return {MEASURED: float(np.median([r.summary["mu_measured"] for r in onp])),
            **{f"{m:g}": m for m in reg.accounting_mus}}


def compute_verdicts(s: JudgedSweep, mus: dict) -> list[tuple[dict, dict]]:
    """The verdicts in compute units, one per (mu, measure): each mu of ``mus`` for every
    run, then each cell's own measured mu (``CELL_MU``) judging the measured mu's
    predictions; as (the record's mu fields: mu, mu_source, budget; ``judge_one``'s record)
    pairs, the AUC records with their compute to target."""
    cell_mu = s.grid.mu_of_cell()
    out = []
    for key, mu in [*mus.items(), (CELL_MU, mus[MEASURED])]:
        mu_of = (lambda r: cell_mu[r.cell]) if key == CELL_MU else (lambda r, mu=mu: mu)
        for m in measures(s.reg):
            table = s.grid.table(lambda r, m=m, mu_of=mu_of: m.score(r, mu_of(r)))
            rec = judge_one(s, m, table, mu_key=MEASURED if key == CELL_MU else key, mu=mu)
            if m.name == "auc":
                rec["compute_to_target"] = to_target_record(
                    s, rec, lambda r, a, mu_of=mu_of: r.compute_to_target(mu_of(r), a))
            out.append(({"mu": mu, "mu_source": key,
                         "budget": s.reg.compute_budget(mu) if m.name == "auc" else None}, rec))
    return out


def seconds_record(s: JudgedSweep, mu: float) -> dict:
    """The verdict in measured seconds (see the module docstring): AUC over seconds in
    [0, ``seconds.seconds_budget``], predictions and the rule at the measured ``mu``,
    seconds to target, and the cells' costs in the unit C (``costs``)."""
    budget = seconds_budget(s.grid)
    m = Measure("auc_seconds", "max", lambda r, mu: mean_over_budget(
        seconds_at_evals(r), r.eval["eval_accuracy"], budget))
    rec = judge_one(s, m, s.grid.table(lambda r: m.score(r, mu)), mu_key=MEASURED, mu=mu)
    rec["compute_to_target"] = to_target_record(s, rec, lambda r, a: curve_to_target(
        seconds_at_evals(r), r.eval["eval_accuracy"], a, interpolate=True))
    return {"budget": budget, "budget_unit": "seconds", **rec, "costs": cell_costs(s.grid)}


def to_target_record(s: JudgedSweep, record: dict, to_target) -> list[dict]:
    """``best_region.compute_to_target`` of the AUC verdict ``record``, with
    ``to_target(run, accuracy)`` the compute or seconds a run takes to first reach an
    accuracy, at the registration's targets (``target_tables``)."""
    return compute_to_target(s.grid, record, target_tables(s, record, to_target),
                             draws=s.reg.draws, seed=s.reg.rng_seed, level=s.reg.level)


def target_tables(s: JudgedSweep, record: dict, to_target) -> list:
    """(target accuracy, (cells, lrs, seeds) ``to_target(run, accuracy)``: compute or seconds
    to first reach it) pairs: the registration's ``compute_targets``, else
    ``best_region.default_targets`` from the AUC verdict ``record``'s best cell."""
    grid = s.grid
    best = grid.labels.index(record["best_cell"])
    lr = next(c["lr"] for c in record["cells"] if c["label"] == record["best_cell"])
    targets = s.reg.compute_targets or default_targets(grid, best, lr, s.warm_start)
    return [(a, grid.table(lambda r, a=a: to_target(r, a))) for a in targets]


def main(argv=None) -> int:
    """``python -m llm_experiments.study.judge --curves C [C ...] --registration R [--calibration D]
    --out validation.json``: the verdicts, and a table of them on the terminal."""
    p = Parser.from_doc("llm_experiments judge", __doc__)
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
