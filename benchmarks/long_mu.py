"""mu measured in seconds on cpu_long, at the natural decode width and under a KV-cache limit
(issue 37 item 1).

On a CPU a small model decodes at full width about as FLOP-efficiently as it trains, so the
measured mu (seconds to generate B rollouts / seconds of one update) stays near 1. On a GPU
a serving engine's KV-cache memory limits how many sequences decode at once, and generation
dominates. ``sampler.max_concurrent`` models that limit: a call decodes in waves of at most
that many rows, which lengthens generation without changing the samples.

For each level (``--levels``, 0 = all rows at once) a short on-policy run of cpu_long
(``run_experiment``, the real loop: generation, grading, update; ``--steps`` updates) is
timed; levels alternate over ``--repeats`` so a drift in the machine's load hits each. Per
run: generation and update seconds from the run's own clock, the measured mu, generation's
share of the on-policy wall time (gen / (gen + update) = mu / (1 + mu), as one batch is made
per update), mu over the updates after the first (``mu_after_first``: without the first
update's one-off costs), and the compute model's mu from FLOPs (``mu_flops``: 2 P per
generated token against 6 P per trained token, blind to how decoding is bound). The seed
paper's GPU shape, generation > 80% of the time, is mu > 4.

Run: ``python -m benchmarks.long_mu [--levels 0 8] [--steps 12] [--repeats 2]``; writes
``benchmarks/results/long_mu.json`` (``--name`` to change).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from benchmarks.common import print_table, set_threads, write_result

# The seed paper's share of GPU time spent generating (> 80%), as a mu: share / (1 - share).
PAPER_SHARE = 0.8


def run_level(level: int, steps: int, seed: int, extra: list[str]) -> dict:
    """One on-policy run of cpu_long at ``sampler.max_concurrent=level``: its seconds and
    mu (keys gen_seconds, update_seconds, mu, gen_share, mu_after_first, first_step,
    mu_flops, load_1min)."""
    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    cfg = load_config("cpu_long", [
        "schedule.mode=on_policy", f"run.steps={steps}", f"run.seed={seed}",
        f"eval.every={steps}", "run.progress=false", f"run.checkpoint_every={steps}",
        f"sampler.max_concurrent={level}", *extra])
    with tempfile.TemporaryDirectory() as out:
        summary = run_experiment(cfg, out)
        rows = [r for r in read_jsonl(os.path.join(out, "metrics.jsonl"))
                if "gen_seconds" in r and r["step"] >= 1]
    first, last = rows[0], rows[-1]
    gen, upd = last["gen_seconds"], last["train_seconds"]
    later = (gen - first["gen_seconds"]) / (upd - first["train_seconds"]) \
        if last["step"] > first["step"] else float("nan")
    return {"max_concurrent": level, "seed": seed, "gen_seconds": gen, "update_seconds": upd,
            "mu": summary["mu_measured"], "gen_share": gen / (gen + upd),
            "mu_after_first": later, "first_step": first["step"],
            "mu_flops": summary["mu_flops"], "load_1min": os.getloadavg()[0]}


def main(argv=None) -> int:
    """Time the levels, print one row per run and the medians per level, write the JSON."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.long_mu", description=__doc__)
    p.add_argument("--levels", type=int, nargs="+", default=[0, 8],
                   help="sampler.max_concurrent values (0 = all rows at once)")
    p.add_argument("--steps", type=int, default=12, help="on-policy updates per run (>= 2)")
    p.add_argument("--repeats", type=int, default=2, help="runs per level (>= 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (>= 1)")
    p.add_argument("--name", default="long_mu", help="result file name")
    p.add_argument("--set", dest="extra", action="append", default=[],
                   metavar="SECTION.KEY=VALUE", help="extra config override (repeatable)")
    a = p.parse_args(argv)
    if a.steps < 2 or a.repeats < 1 or a.threads < 1 or min(a.levels) < 0:
        p.error("--steps must be >= 2, --repeats >= 1, --threads >= 1, --levels >= 0")
    set_threads(a.threads)
    runs = []
    for r in range(a.repeats):
        order = a.levels if r % 2 == 0 else a.levels[::-1]
        runs += [run_level(level, a.steps, r, a.extra) for level in order]
    cols = ["max_concurrent", "seed", "gen_seconds", "update_seconds", "mu", "gen_share",
            "mu_after_first", "mu_flops", "load_1min"]
    print_table(runs, cols)
    levels = []
    for level in a.levels:
        mine = [x for x in runs if x["max_concurrent"] == level]
        mu = statistics.median(x["mu"] for x in mine)
        levels.append({"max_concurrent": level, "mu": mu, "gen_share": mu / (1 + mu),
                       "mu_after_first": statistics.median(x["mu_after_first"] for x in mine),
                       "mu_flops": statistics.median(x["mu_flops"] for x in mine),
                       "vs_paper_mu": mu / (PAPER_SHARE / (1 - PAPER_SHARE))})
    print("\nmedians per level (vs_paper_mu: measured mu / 4, the seed paper's > 80% share)")
    print_table(levels, ["max_concurrent", "mu", "gen_share", "mu_after_first", "mu_flops",
                         "vs_paper_mu"])
    write_result(a.name, {"args": vars(a), "runs": runs, "levels": levels})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
