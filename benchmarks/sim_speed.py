"""Speed of the simulators: not a timed test, a record.

* the tabular problem: a 6 x 6 (x, y) grid x 5 seeds x 2000 steps (one step size), vectorised
  over the cells that share (B, R);
* the pipeline simulator: 10^6 rollouts, (W, T) = (6, 2), mu = 6.84, B = 60, N = 252.

Prints a table and writes benchmarks/results/sim_speed.json. Single-threaded BLAS is set here
for every contender (run as ``OMP_NUM_THREADS=1 python benchmarks/sim_speed.py``); times on a
shared machine are rough.
"""

from __future__ import annotations

import os
import platform
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from replaytheory import TabularProblem, simulate_pipeline, simulate_replay  # noqa: E402
from replaytheory.io import write_json  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "sim_speed.json")


def tabular_grid(steps: int = 2000, seeds: int = 5) -> dict:
    """x in {4, ..., 32} and y in {0.5, ..., 4}: all 36 cells have N >= B."""
    b = 96
    cells = [(x * r, b, r)
             for r in (192, 128, 96, 64, 48, 24) for x in (4, 6, 8, 12, 16, 32)]
    t0 = time.perf_counter()
    res = simulate_replay(TabularProblem(), cells, steps=steps, lrs=[16.0], seeds=seeds)
    seconds = time.perf_counter() - t0
    return {"what": "tabular 6x6 (x, y) grid x 5 seeds x 2000 steps", "cells": len(cells),
            "seeds": seeds, "steps": steps, "runs": len(cells) * seeds, "seconds": seconds,
            "us_per_run_step": 1e6 * seconds / (len(cells) * seeds * steps),
            "final_loss_mean": float(np.nanmean(res.loss[..., -1]))}


def pipeline(rollouts: int = 1_000_000) -> dict:
    t0 = time.perf_counter()
    res = simulate_pipeline(workers=6, trainers=2, mu=6.84, batch_size=60, buffer_size=252,
                            rollouts=rollouts)
    seconds = time.perf_counter() - t0
    return {"what": "pipeline 10^6 rollouts, (W,T)=(6,2), mu=6.84, B=60, N=252",
            "rollouts": rollouts, "uses": res.samples_consumed, "steps": res.steps,
            "seconds": seconds, "us_per_rollout": 1e6 * seconds / rollouts,
            "mean_replay_ratio": res.mean_replay_ratio}


def main() -> int:
    rows = [tabular_grid(), pipeline()]
    print(f"{'benchmark':<60} {'seconds':>9}")
    for r in rows:
        print(f"{r['what']:<60} {r['seconds']:9.2f}")
    write_json(OUT, {"machine": platform.platform(), "python": platform.python_version(),
                     "numpy": np.__version__, "omp_num_threads": os.environ["OMP_NUM_THREADS"],
                     "results": rows})
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
