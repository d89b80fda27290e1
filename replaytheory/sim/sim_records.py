"""Records of the simulated validation (``validate_sim``), their JSON files and the loader.

``validate_sim.run_validation`` writes, into one folder, for every problem variant ``LABEL``
("quadratic", "tabular-grpo", "tabular-grpo_unclipped", ...; ``ScoreRecord.label``):

* ``summary.json``: a list of ``ScoreRecord`` objects, one per (variant, mu, design), each
  flat: the ``ScoreRecord`` fields, with ``fits`` spread into the record (``FitSummary``
  fields; ``kappa`` and ``kappa_interval`` only when the bias was fitted) and
  ``design_detail`` an object (``FiniteEtaDetail``) or ``{}``;
* ``grid_LABEL.json``: ``{"label", "problem" (the problem's parameters), "mus",
  "cells" ([N, B, R] per cell), "horizon" (x = N/R per cell), "replay_ratio" (y = B/R per
  cell), "loss" and "best_lr" ([mu][cell]: loss at the budget at the best step size, and that
  step size), "predictions" ([mu]{design: {"continuous": [x, y], "cell": [N, B, R]}}),
  "seconds"}``;
* ``calibration_LABEL.json``: ``calibrate.Calibration.to_dict()``; ``probes_LABEL.npz``: the
  ``ProbeSet`` behind it;
* ``pipeline_histograms.json``: a list of ``PipelineRun`` objects (the Fig. 2 runs);
* ``reuse_LABEL.json``: the ``ScoreRecord`` objects of theory.md section 10's variants
  (``validate_sim.REUSE_DESIGNS``), in the ``summary.json`` record format.

Units: horizons in trainer steps, replay ratios in uses per rollout, budgets and compute in
samples (rollout uses), losses in the problem's loss F (theory.md section 4), regret as extra
compute over the budget (theory.md section 5). nan and inf are written as null.

``load_validation(folder)`` reads these files back into the records (the figures use it).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields

import numpy as np

from ..io import write_json


@dataclass(frozen=True)
class FiniteEtaDetail:
    """The finite-step-size design's optimum (theory.md section 5.8: the bound at the budget).

    Args:
        lr: optimal constant step size eta. bound: the bound's value at the optimum (loss
        units). descent, bias_driven, smoothness_driven: its three terms.
    """

    lr: float
    bound: float
    descent: float
    bias_driven: float
    smoothness_driven: float


@dataclass(frozen=True)
class Prediction:
    """One design's recommendation at one mu.

    Args:
        design: one of ``validate_sim.DESIGNS``. continuous: (x*, y*), horizon in steps and
        replay ratio. cell: the integer (N, B, R) simulated for it. note: the design's notes
        ("" when none or not saved). detail: the finite-eta optimum (None for other designs).
    """

    design: str
    continuous: tuple[float, float]
    cell: tuple[int, int, int]
    note: str = ""
    detail: FiniteEtaDetail | None = None


@dataclass(frozen=True)
class GridResult:
    """Loss at the compute budget over the grid of buffer designs, per mu.

    Args:
        mus: the mu values (cost of a batch of rollouts over one update, > 0).
        cells: (n_cells, 3) integer (N, B, R). horizon, replay_ratio: (n_cells,) x = N/R and
        y = B/R. loss, best_lr: (n_mus, n_cells) loss at the budget at the best step size
        (nan if every step size diverged) and that step size.
        probes: the grid runs' minibatch probes (for the calibration; not saved).
    """

    mus: tuple[float, ...]
    cells: np.ndarray
    horizon: np.ndarray
    replay_ratio: np.ndarray
    loss: np.ndarray
    best_lr: np.ndarray
    probes: object = None

    def best(self, m: int) -> int:
        """Index of the cell with the lowest loss at mu index ``m``."""
        return int(np.nanargmin(self.loss[m]))


@dataclass(frozen=True)
class FitSummary:
    """Fitted constants with bootstrap intervals (theory.md section 8), as saved per record.

    Args:
        alpha, tau: the power-law noise sigma(s) = (s / tau)^alpha. rho: the coupling the
        theory uses; rho_gap its gap-form fit; rho_eff the coupling the buffer realises. Each
        ``*_interval`` is (low, high). goodness_of_fit: the fits' diagnostics (r2, chi2,
        p-values, reasons; keys as ``validate_sim.fit_summary`` writes them), for readers of
        the file. kappa, kappa_interval: the staleness bias (None when not fitted).
    """

    alpha: float
    alpha_interval: tuple[float, float]
    tau: float
    tau_interval: tuple[float, float]
    rho: float
    rho_interval: tuple[float, float]
    rho_gap: float
    rho_gap_interval: tuple[float, float]
    rho_eff: float
    rho_eff_interval: tuple[float, float]
    goodness_of_fit: dict
    kappa: float | None = None
    kappa_interval: tuple[float, float] | None = None

    def to_json(self) -> dict:
        out = asdict(self)
        if self.kappa is None:  # not fitted: the keys are left out, not null
            del out["kappa"], out["kappa_interval"]
        return out

    @classmethod
    def from_json(cls, d: dict) -> "FitSummary":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


@dataclass(frozen=True)
class ScoreRecord:
    """How one design did at one mu on one problem variant (a ``summary.json`` record).

    Args:
        problem: "quadratic" or "tabular". loss: the tabular problem's loss
            (``sim_tabular.LOSSES``), "quadratic" for the quadratic. mu: > 0. design: one of
            ``validate_sim.DESIGNS``.
        predicted_horizon, predicted_replay_ratio: x = N/R and y = B/R of the design's cell.
        best_horizon, best_replay_ratio: those of the grid's best cell.
        regret: C_needed / C - 1 (None if the design never reached the target within
            ``regret_factor`` x C; then regret_exceeds = regret_factor - 1, else None).
        replay_ratio_ratio, horizon_ratio: predicted over best.
        predicted_continuous: (x*, y*). predicted_cell, best_cell: (N, B, R).
        best_loss: the best cell's loss at the budget under the scoring protocol (the regret's
            target); best_loss_grid: its loss in the grid. near_best_cells: (x, y) of the grid
            cells within 2% of the best loss. predicted_loss_at_budget: the design's loss at
            the budget; loss_ratio_at_budget: over best_loss. budget: C in samples.
        fits: the calibration. design_notes: the design's notes. design_detail: the
            finite-eta optimum (None for other designs). best_lr: the best cell's step size.
        calibration_notes: the calibration's notes.
    """

    problem: str
    loss: str
    mu: float
    design: str
    predicted_horizon: float
    predicted_replay_ratio: float
    best_horizon: float
    best_replay_ratio: float
    regret: float | None
    regret_exceeds: float | None
    replay_ratio_ratio: float
    horizon_ratio: float
    predicted_continuous: tuple[float, float]
    predicted_cell: tuple[int, int, int]
    best_cell: tuple[int, int, int]
    best_loss: float
    best_loss_grid: float
    near_best_cells: tuple
    predicted_loss_at_budget: float
    loss_ratio_at_budget: float
    budget: float
    fits: FitSummary
    design_notes: str
    design_detail: FiniteEtaDetail | None
    best_lr: float
    calibration_notes: tuple[str, ...]

    @property
    def label(self) -> str:
        """The variant's name in file names: "quadratic" or "tabular-LOSS"."""
        return self.problem if self.loss == "quadratic" else f"{self.problem}-{self.loss}"

    def to_json(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "fits":
                out.update(value.to_json())
            elif f.name == "design_detail":
                out[f.name] = {} if value is None else asdict(value)
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, d: dict) -> "ScoreRecord":
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["fits"] = FitSummary.from_json(d)
        detail = d["design_detail"]
        kw["design_detail"] = FiniteEtaDetail(**detail) if detail else None
        for name in ("predicted_continuous", "predicted_cell", "best_cell", "calibration_notes"):
            kw[name] = tuple(kw[name])
        kw["near_best_cells"] = tuple(tuple(c) for c in kw["near_best_cells"])
        return cls(**kw)


@dataclass(frozen=True)
class VariantResult:
    """Everything measured on one problem variant.

    Args:
        label: ``ScoreRecord.label``. problem: the problem's parameters (``to_dict()``).
        grid: the grid. predictions: per mu, one ``Prediction`` per design. records: the
        ``ScoreRecord`` objects of this variant. seconds: wall time of the variant's run.
    """

    label: str
    problem: dict
    grid: GridResult
    predictions: tuple[tuple[Prediction, ...], ...]
    records: tuple[ScoreRecord, ...]
    seconds: float

    def grid_json(self) -> dict:
        """The ``grid_LABEL.json`` content (module docstring)."""
        g = self.grid
        return {"label": self.label, "problem": self.problem, "mus": list(g.mus),
                "cells": g.cells.tolist(), "horizon": g.horizon.tolist(),
                "replay_ratio": g.replay_ratio.tolist(), "loss": g.loss.tolist(),
                "best_lr": g.best_lr.tolist(),
                "predictions": [{p.design: {"continuous": list(p.continuous),
                                            "cell": list(p.cell)} for p in per_mu}
                                for per_mu in self.predictions],
                "seconds": self.seconds}

    @classmethod
    def from_json(cls, grid: dict, records) -> "VariantResult":
        """From a ``grid_LABEL.json`` object and the variant's ``ScoreRecord`` objects."""
        as_float = lambda key: np.array(grid[key], dtype=float)  # noqa: E731 (null -> nan)
        g = GridResult(mus=tuple(grid["mus"]), cells=np.array(grid["cells"], dtype=np.int64),
                       horizon=as_float("horizon"), replay_ratio=as_float("replay_ratio"),
                       loss=as_float("loss"), best_lr=as_float("best_lr"))
        preds = tuple(tuple(Prediction(design=d, continuous=tuple(p["continuous"]),
                                       cell=tuple(p["cell"])) for d, p in per_mu.items())
                      for per_mu in grid["predictions"])
        return cls(label=grid["label"], problem=grid["problem"], grid=g, predictions=preds,
                   records=tuple(records), seconds=grid["seconds"])


@dataclass(frozen=True)
class PipelineRun:
    """One run of the pipeline simulator for Fig. 2 (``pipeline_sim.PipelineResult``'s
    scalars and histograms, with its (W, T, N)).

    Args:
        workers, trainers: W and T. buffer_size: N. The scalars: as in ``PipelineResult``.
        histograms: {"off_policiness" | "replay_ratio" | "steps_since_last_use":
        {value: count}}, value an integer (steps or uses) or "new" (first uses).
    """

    workers: int
    trainers: int
    buffer_size: int
    steps: int
    unique_rollouts: int
    samples_consumed: int
    mean_replay_ratio: float
    expected_replay_ratio: float
    compute_per_update: float | None
    trainer_idle_fraction: float | None
    worker_idle_fraction: float | None
    warmup_time: float | None
    wall_time: float
    histograms: dict

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "PipelineRun":
        hist = {name: {(k if k == "new" else int(k)): c for k, c in h.items()}
                for name, h in d["histograms"].items()}  # JSON made the keys strings
        return cls(**{**d, "histograms": hist})


@dataclass(frozen=True)
class ValidationResults:
    """A validate-sim output folder: the variants (in run order) and the pipeline runs."""

    variants: tuple[VariantResult, ...]
    pipeline: tuple[PipelineRun, ...]

    @property
    def records(self) -> tuple[ScoreRecord, ...]:
        """Every ``ScoreRecord`` (the ``summary.json`` list)."""
        return tuple(r for v in self.variants for r in v.records)


def save_variant(variant: VariantResult, out_dir: str) -> None:
    """Write ``grid_LABEL.json``."""
    write_json(os.path.join(out_dir, f"grid_{variant.label}.json"), variant.grid_json())


def save_summary(results: ValidationResults, out_dir: str) -> None:
    """Write ``summary.json`` and ``pipeline_histograms.json``."""
    write_json(os.path.join(out_dir, "pipeline_histograms.json"),
               [r.to_json() for r in results.pipeline])
    write_json(os.path.join(out_dir, "summary.json"), [r.to_json() for r in results.records])


def load_validation(folder: str) -> ValidationResults:
    """Read a validate-sim output folder (module docstring) back into the records.

    Raises FileNotFoundError if ``summary.json`` or a variant's ``grid_LABEL.json`` is
    missing; a missing ``pipeline_histograms.json`` gives no pipeline runs.
    """
    with open(os.path.join(folder, "summary.json")) as fh:
        records = [ScoreRecord.from_json(d) for d in json.load(fh)]
    labels = list(dict.fromkeys(r.label for r in records))  # run order
    variants = []
    for label in labels:
        with open(os.path.join(folder, f"grid_{label}.json")) as fh:
            grid = json.load(fh)
        variants.append(VariantResult.from_json(grid, [r for r in records if r.label == label]))
    pipeline = ()
    path = os.path.join(folder, "pipeline_histograms.json")
    if os.path.exists(path):
        with open(path) as fh:
            pipeline = tuple(PipelineRun.from_json(d) for d in json.load(fh))
    return ValidationResults(variants=tuple(variants), pipeline=pipeline)


__all__ = ["FiniteEtaDetail", "FitSummary", "GridResult", "PipelineRun", "Prediction",
           "ScoreRecord", "ValidationResults", "VariantResult", "load_validation",
           "save_summary", "save_variant"]
