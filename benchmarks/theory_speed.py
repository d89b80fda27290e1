"""Time the analytic side: one ``optimal_config`` call and 100 x 100 (mu, alpha) design grids.

Run: ``python -m benchmarks.theory_speed``. Prints a table and writes
``benchmarks/results/theory_speed.json``. Times are medians over repeats on this machine.
"""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path

import numpy as np

from replaytheory import PowerLawNoise, optimal_config, optimal_design, power_law_optimum
from replaytheory.io import write_json

RESULTS = Path(__file__).resolve().parent / "results" / "theory_speed.json"


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def grid(method, n=100):
    mus, alphas = np.geomspace(0.25, 100, n), np.linspace(0.0, 0.6, n)
    for mu in mus:
        for a in alphas:
            optimal_design(float(mu), 0.1, PowerLawNoise(float(a)), method=method)


def main() -> dict:
    mus, alphas = np.meshgrid(np.geomspace(0.25, 100, 100), np.linspace(0.0, 0.6, 100))
    rows = {
        "optimal_config (8 GPUs, batch 60)": timed(
            lambda: optimal_config(mu=6.84, rho=0.1, alpha=0.1, gpus=8, batch_size=60), 50),
        "optimal_config (8 GPUs, batch 60, section 5)": timed(
            lambda: optimal_config(mu=6.84, rho=0.1, alpha=0.1, gpus=8, batch_size=60,
                                   reuse=None), 50),
        "optimal_config (sync, batch 32..128)": timed(
            lambda: optimal_config(mu=6.84, rho=0.1, alpha=0.1, batch_size=(32, 128)), 3),
        "optimal_config (sync, batch 32..128, section 5)": timed(
            lambda: optimal_config(mu=6.84, rho=0.1, alpha=0.1, batch_size=(32, 128),
                                   reuse=None), 3),
        "100x100 optimal_design, closed form": timed(lambda: grid("closed_form"), 3),
        "100x100 optimal_design, numeric": timed(lambda: grid("numeric"), 1),
        "100x100 power_law_optimum, vectorised": timed(
            lambda: power_law_optimum(mus, 0.1, alphas), 20),
    }
    width = max(map(len, rows))
    for name, sec in rows.items():
        print(f"{name:<{width}}  {sec * 1e3:10.2f} ms")
    result = {"seconds": rows, "machine": platform.processor() or platform.machine(),
              "python": platform.python_version()}
    write_json(str(RESULTS), result)
    return result


if __name__ == "__main__":
    main()
