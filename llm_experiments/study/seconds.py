"""A judged grid in measured seconds (issue 27 item 2; theory.md section 3.7).

The compute model charges every update one unit C. Here the unit is fixed once, in seconds:
C = an on-policy update of B rollouts, the median of the on-policy runs' seconds per update
(the grid's cell with the cheapest median update where it has no on-policy cell). Each run's
measured costs are its two clocks (``schedule.ComputeClock``): seconds per update
(``train_seconds_per_step``) and seconds per generated rollout (``gen_seconds_per_step`` x
steps / rollouts generated). Evaluation, probes, logging and checkpoints are left out (the
same work for every cell, not part of the method), as in the compute units of section 3.6;
drawing a batch from the buffer is too (it lies outside the update's clock: 0.2-0.3 ms a
draw at any horizon against 60-100 ms an update, ``benchmarks/update_cost.py``).

* ``RunCosts``: a run's measured seconds per update and per rollout, and its seconds at each
  evaluation: K_t s_update + S_t s_rollout (K_t updates, S_t rollouts made before it). The
  compacted curves keep the clocks' totals only, so a run's costs are its averages.
* ``seconds_budget``: the budget of the seconds AUC, the smallest median total seconds over
  the cells (the cheapest cell's median run): a budget every cell's median run reaches.
* ``cell_costs``: per cell, its update's cost and its mu in the unit C (mu = the seconds to
  generate B rollouts over C), and its median seconds.

``grid`` is a ``judge.SweepGrid``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

UNIT = "an on-policy update of B rollouts"


@dataclass(frozen=True)
class RunCosts:
    """A run's measured costs: update (seconds per update, > 0) and rollout (seconds per
    generated rollout, >= 0)."""

    update: float
    rollout: float

    @classmethod
    def of(cls, run) -> RunCosts:
        """The costs a run's summary records; ValueError names a run without its clocks."""
        s = run.summary
        if not s.get("steps") or not s.get("samples_generated") or \
                s.get("train_seconds_per_step") is None or s.get("gen_seconds_per_step") is None:
            raise ValueError(f"run {run.run_id} has no timing in its summary (steps, "
                             "samples_generated, train_seconds_per_step, gen_seconds_per_step): "
                             "it cannot be scored in seconds")
        return cls(update=float(s["train_seconds_per_step"]),
                   rollout=float(s["gen_seconds_per_step"]) * s["steps"]
                   / s["samples_generated"])

    def at_evals(self, run) -> np.ndarray:
        """Seconds spent before each of ``run``'s evaluations (updates and generation)."""
        return run.eval["step"] * self.update + run.eval["samples_generated"] * self.rollout

    def total(self, run) -> float:
        """Seconds of the whole run (its final updates and every rollout it made)."""
        s = run.summary
        return s["steps"] * self.update + s["samples_generated"] * self.rollout


def seconds_at_evals(run) -> np.ndarray:
    """``RunCosts.of(run).at_evals(run)``: the x axis of the seconds AUC."""
    return RunCosts.of(run).at_evals(run)


@dataclass(frozen=True)
class CellMedians:
    """A cell's medians over its runs: seconds per update, per generated rollout and per run."""

    update: float
    rollout: float
    run: float

    @classmethod
    def of(cls, runs: list) -> CellMedians:
        costs = [(RunCosts.of(r), r) for r in runs]
        return cls(update=float(np.median([k.update for k, _ in costs])),
                   rollout=float(np.median([k.rollout for k, _ in costs])),
                   run=float(np.median([k.total(r) for k, r in costs])))


def _cell_medians(grid) -> dict[int, CellMedians]:
    """cell index -> its ``CellMedians``."""
    return {i: CellMedians.of(grid.runs[c]) for i, c in enumerate(grid.cells)}


def seconds_budget(grid) -> float:
    """The seconds AUC's budget: the smallest over cells of the cell's median run seconds."""
    return min(m.run for m in _cell_medians(grid).values())


@dataclass(frozen=True)
class CellCost:
    """One cell in the unit C: update_cost (its seconds per update / C), mu (its seconds to
    generate B rollouts / C), seconds (its median run, seconds)."""

    label: str
    update_cost: float
    mu: float
    seconds: float


def cell_costs(grid) -> dict:
    """The unit and every cell's costs in it, as a record: {"unit": UNIT, "unit_cell": the
    cell that defines it, "unit_seconds": C, "cells": [``CellCost`` as dicts]}."""
    med = _cell_medians(grid)
    ref = grid.on_policy if grid.on_policy >= 0 else min(med, key=lambda i: med[i].update)
    unit = med[ref].update
    b = grid.batch_size
    return {"unit": UNIT if grid.on_policy >= 0 else "the cheapest cell's update of B rollouts",
            "unit_cell": grid.labels[ref], "unit_seconds": unit,
            "cells": [asdict(CellCost(label=grid.labels[i], update_cost=m.update / unit,
                                      mu=m.rollout * b / unit, seconds=m.run))
                      for i, m in med.items()]}
