"""Where a harness step spends its time: torch.profiler over a few trainer steps.

Run: ``python -m benchmarks.profile_step [--steps 10] [--threads 1] [--set key=value ...]``
(``--set run.fast_kernels=false --set run.direct_forward=false`` profiles the harness as it
was before the speed work). Prints the phase split (sampling, update, the rest) and the
operators with the most self CPU time; writes ``benchmarks/results/profile_step.json``.

Setting: cpu_tiny on-policy (B = 64 rollouts of G = 8, up to 6 new tokens), no probes, after
3 warm-up steps; ``--steps`` unprofiled steps give the phase split (sampling = the sampler's
clock, update = the trainer's clock, the rest: rewards, buffer, bookkeeping), as many profiled
steps the operator table.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from benchmarks.common import print_table, set_threads, write_result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="profiled trainer steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--top", type=int, default=15, help="operators to list")
    parser.add_argument("--set", action="append", default=[], help="config override")
    parser.add_argument("--cache", default=os.environ.get("LLM_EXPERIMENTS_CACHE", ".cache"),
                        help="warm-start cache folder")
    parser.add_argument("--name", default="profile_step", help="result file name")
    args = parser.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import Experiment
    set_threads(args.threads)
    cfg = load_config("cpu_tiny", ["schedule.mode=on_policy", "probe.every=0",
                                   f"run.threads={args.threads}", "run.progress=false",
                                   f"run.cache_dir={args.cache}", *args.set])
    with tempfile.TemporaryDirectory() as out:
        exp = Experiment(cfg, out)
        for _ in range(3):
            exp.advance()
        # The phase split from unprofiled steps: the profiler's per-operator overhead would
        # inflate the phases with many small operators.
        c = exp.clock
        gen0, train0 = c.gen_seconds, c.train_seconds
        t0 = time.perf_counter()
        for _ in range(args.steps):
            exp.advance()
        wall = time.perf_counter() - t0
        gen, train = c.gen_seconds - gen0, c.train_seconds - train0
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                exp.advance()
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    rows = [{"operator": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1e3,
             "share": e.self_cpu_time_total / total} for e in ops[:args.top]]
    phases = {"seconds_per_step": wall / args.steps, "sampling_share": gen / wall,
              "update_share": train / wall, "other_share": 1 - (gen + train) / wall}
    print(", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
    print("operators: self CPU time under the profiler (which adds overhead per operator)")
    print_table(rows, ["operator", "calls", "self_ms", "share"])
    result = {"overrides": args.set, "steps": args.steps, "threads": args.threads,
              **phases, "operators": rows}
    write_result(args.name, result)
    return result


if __name__ == "__main__":
    main()
