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
        return cls(float(s["train_seconds_per_step"]),
                   float(s["gen_seconds_per_step"]) * s["steps"] / s["samples_generated"])

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


def _cell_medians(grid) -> dict:
    """cell index -> (median seconds per update, per rollout, per run) over its runs."""
    out = {}
    for i, c in enumerate(grid.cells):
        costs = [(RunCosts.of(r), r) for r in grid.runs[c]]
        out[i] = tuple(float(np.median(v)) for v in zip(*[(k.update, k.rollout, k.total(r))
                                                          for k, r in costs]))
    return out


def seconds_budget(grid) -> float:
    """The seconds AUC's budget: the smallest over cells of the cell's median run seconds."""
    return min(m[2] for m in _cell_medians(grid).values())


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
    ref = grid.on_policy if grid.on_policy >= 0 else min(med, key=lambda i: med[i][0])
    unit = med[ref][0]
    b = grid.batch_size
    return {"unit": UNIT if grid.on_policy >= 0 else "the cheapest cell's update of B rollouts",
            "unit_cell": grid.labels[ref], "unit_seconds": unit,
            "cells": [asdict(CellCost(grid.labels[i], m[0] / unit, m[1] * b / unit, m[2]))
                      for i, m in med.items()]}
