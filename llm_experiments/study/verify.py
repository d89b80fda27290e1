"""``verify``: run the grid a prediction registered and judge the prediction against it.

``python -m llm_experiments verify --prediction DIR/prediction.json --out DIR2 [--seeds K]
[--workers 2]``

1. The grid of ``prediction.json`` (on-policy and every (x, y) of its horizons and replay
   ratios, each at its learning rates, seeds 0..K-1) runs as a resumable sweep in
   ``DIR2/runs``: rerun the same command after an interruption.
2. ``DIR2/curves.jsonl``: the compacted results (small enough to commit).
3. ``DIR2/validation.json``: the seed-bootstrap verdicts of ``judge`` (probability that each
   cell is best, the best cell and whether it is interior, each variant's regret and Spearman
   with intervals, the split-half gate) at the measured mu, the accounting mus and each
   cell's own mu, for the primary measure and the registered targets. A second registration
   on the same grid (``predict --from``, ``prediction_<x>.json``) reuses the runs and writes
   ``DIR2/validation_<x>.json``.

Default budget (cpu_tiny, 3 seeds, a grid of ~4 horizons x ~6 ratios, 3 learning rates:
~220 runs of ~50 s):
about 2 hours on 2 cores; ``--seeds 2`` halves it. More seeds later: rerun with a larger
``--seeds`` (finished runs are kept).
"""

from __future__ import annotations

import glob
import os

from replaytheory.cli_input import (Parser, existing_file, integer, missing_field, output_dir,
                                    read_json)
from replaytheory.io import write_json

from .judge import Registration, judge
from .results import compact_sweep
from .sweep import run_sweep

RUN_SETTINGS = {"probe.every": 0, "run.progress": False}
GRID_FIELDS = ("config", "loss", "learning_rates", "horizons", "replay_ratios")  # grid_spec's


def grid_spec(prediction: dict, seeds: int) -> dict:
    """The sweep spec of a prediction's grid (seed-major, so a partial sweep is balanced)."""
    cells = []
    for lr in prediction["learning_rates"]:
        cells.append({"schedule.mode": "on_policy", "trainer.lr": lr})
    for x in prediction["horizons"]:
        for y in prediction["replay_ratios"]:
            for lr in prediction["learning_rates"]:
                cells.append({"schedule.mode": "sync", "buffer.horizon": x,
                              "schedule.replay_ratio": y, "trainer.lr": lr})
    return {"config": prediction["config"],
            "set": {**prediction.get("set", {}), **RUN_SETTINGS,
                    "trainer.loss": prediction["loss"]},
            "cells": cells, "grid": {"run.seed": list(range(seeds))}}


def verify(prediction_path: str, out: str, *, seeds: int = 3, workers: int = 2,
           progress: bool = True, done_in: tuple[str, ...] = ()) -> list[dict]:
    """Run (or continue) the grid and write ``out/validation.json`` (``validation_name``);
    returns its records. ``done_in``: committed compacted curves of this grid (e.g. from a
    machine that is gone): their runs are not rerun and join ``out/curves.jsonl``
    (``sweep.run_sweep``)."""
    if not isinstance(seeds, int) or seeds < 2:
        raise ValueError(f"--seeds must be an integer >= 2 (the gate splits the seeds in "
                         f"two halves), got {seeds!r}")
    reg = Registration.load(prediction_path, "--prediction")
    prediction = read_json(prediction_path, "--prediction")
    for key in GRID_FIELDS:  # a preregistration of a hand-made grid may name no config
        if key not in prediction:
            raise missing_field(KeyError(key), prediction_path, "--prediction",
                                "a prediction.json written by predict")
    runs_dir = os.path.join(out, "runs")
    counts = run_sweep(grid_spec(prediction, seeds), runs_dir, workers=workers,
                       progress=progress, done_in=done_in)
    if counts.failed:
        raise RuntimeError(f"{counts.failed} run(s) failed: see {runs_dir}/logs and "
                           f"{runs_dir}/failures.jsonl; rerun to retry them")
    curves = os.path.join(out, "curves.jsonl")
    compact_sweep(runs_dir, curves, keep=done_in)
    cal_dir = os.path.join(os.path.dirname(prediction_path), "calibration")
    has_probes = bool(glob.glob(os.path.join(cal_dir, "runs", "*", "probes.npz")) or
                      glob.glob(os.path.join(cal_dir, "*.npz")))
    # Without the prediction's probes the verdicts are complete except each variant's
    # Spearman, which needs its objective J over the grid.
    records = judge(curves, reg, cal_dir if has_probes else None)
    write_json(os.path.join(out, validation_name(prediction_path)), records)
    return records


def validation_name(prediction_path: str) -> str:
    """``validation.json`` for ``prediction.json``; ``validation_<x>.json`` for a second
    registration ``prediction_<x>.json`` on the same grid (``predict --from``)."""
    base = os.path.basename(prediction_path)
    if base.startswith("prediction_") and base.endswith(".json"):
        return "validation_" + base[len("prediction_"):]
    return "validation.json"


def main(argv=None) -> int:
    p = Parser.from_doc("llm_experiments verify", __doc__)
    p.add_argument("--prediction", type=existing_file, required=True,
                   help="prediction.json written by predict")
    p.add_argument("--out", type=output_dir, required=True, help="folder for runs/, "
                   "curves.jsonl, validation.json (rerun to continue)")
    # the gate splits the seeds in two halves
    p.add_argument("--seeds", type=integer(2), default=3,
                   help="seeds per cell (>= 2, default 3)")
    p.add_argument("--workers", type=integer(1), default=2,
                   help="runs at a time (>= 1, default 2)")
    p.add_argument("--done-in", type=existing_file, nargs="+", default=[], metavar="CURVES",
                   help="committed curves.jsonl of this grid: their runs are kept, not rerun "
                        "(continue on another machine)")
    a = p.parse_args(argv)
    try:
        records = verify(a.prediction, a.out, seeds=a.seeds, workers=a.workers,
                         done_in=tuple(a.done_in))
    except (ValueError, RuntimeError) as exc:
        return p.report(exc)
    for r in records:
        if r["measure"] != "auc":
            continue
        preds = "; ".join(f"{v} -> {d['cell']} regret {d['regret']['median']:.2f}"
                          for v, d in r["predictions"].items())
        print(f"mu {r['mu_source']}={r['mu']:.3g}: best {r['best_cell']} "
              f"(p = {r['best_probability']:.2f}), gate {r['gate_spearman']:.2f}; {preds}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
