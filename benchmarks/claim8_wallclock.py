"""Claim 8 (theory.md section 7): a replay buffer against on-policy in wall-clock time to a
target accuracy, on the Ray engine (issue 12, item 4).

``python -m benchmarks.claim8_wallclock [--seeds 0 1] [--steps 150] [--buffer-steps 300]
[--delay 0.3] [--sigma 0.5] [--horizon 8] [--mu-plan 3] [--target 0.5]``

On cpu_tiny generation is cheap (measured mu ~0.3-0.5), so the wall-clock effect of an
asynchronous buffer cannot show. Each sampler call therefore sleeps an INJECTED delay
(``schedule.injected_gen_delay`` = ``--delay`` seconds median, lognormal spread
``schedule.injected_gen_sigma`` = ``--sigma``: a straggler distribution), which makes the
effective mu (measured: seconds generating B rollouts, delay included, over seconds of one
update) about 2-4 on this machine; the measured value is reported per run.

Both arms run on the Ray engine with W = T = 1, the same seeds, interleaved (the arm order
alternates per seed, so a drift in the machine's load hits both):

* on-policy: ``buffer.lifo=true`` with ``buffer.capacity`` = B. The sampler waits while the
  queue holds a batch, so it generates B rollouts with the newest weights, the trainer trains
  on them once, and so on: the synchronous on-policy loop (staleness 0, reported), the Ray
  equivalent of ``schedule.mode=on_policy`` (which the Ray engine does not take).
* buffer: FIFO replay buffer, sampling with replacement, N = round(x B / mu_plan) with a fixed
  horizon x = ``--horizon`` steps at the planned mu ``--mu-plan`` (a documented choice, not
  the calculator's: its constants come from the emulated sweep); the sampler and the trainer
  run concurrently, so the replay ratio settles near the effective mu.

Measured per run: wall-clock seconds to the first evaluation (every ``--eval-every`` steps)
with held-out accuracy >= ``--target``, in total (``wall_time``, Ray actor start-up included)
and after start-up; compute to the target, steps + mu * generated / B with one mu for every
run (the median of the runs' measured mu); the ratio buffer / on-policy per seed and the
median. A run that never reaches the target has no time (null). Writes
``benchmarks/results/claim8_wallclock.json`` (atomically) with the load averages before and
after each run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass

from benchmarks.common import print_table, write_result

CACHE = os.environ.get("LLM_EXPERIMENTS_CACHE") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache")
B = 64  # cpu_tiny's schedule.batch_size
ARMS = ("on_policy", "buffer")


@dataclass
class Hit:
    """Where a run first reached the target: step, wall seconds (total and after actor
    start-up), rollouts generated, compute units at the benchmark's common mu (filled in
    once every run is done)."""

    step: int
    wall_seconds: float
    wall_after_startup: float
    generated: int
    compute: float | None = None


@dataclass
class RunResult:
    """One run: arm, seed, its measured mu, the injected delay slept, staleness and replay
    ratio, warm-start and best accuracy, the hit (None if the target was never reached),
    load averages (1 min) before and after."""

    arm: str
    seed: int
    steps: int
    mu_measured: float
    injected_gen_delay_seconds: float
    wall_time: float
    startup_seconds: float
    staleness_mean: float
    replay_ratio_mean: float
    warm_start_accuracy: float
    best_eval_accuracy: float
    hit: Hit | None
    load_before: float
    load_after: float


def arm_overrides(arm: str, args) -> list[str]:
    """The cpu_tiny overrides of one arm (module docstring)."""
    common = ["schedule.engine=ray", "schedule.mode=async", "schedule.workers=1",
              "schedule.trainers=1", "probe.every=0", "eval.pass_k_problems=0",
              f"eval.every={args.eval_every}", "run.progress=false",
              f"run.threads={args.threads}", f"run.cache_dir={CACHE}",
              f"schedule.injected_gen_delay={args.delay}",
              f"schedule.injected_gen_sigma={args.sigma}"]
    if arm == "on_policy":
        return common + [f"run.steps={args.steps}", f"run.checkpoint_every={args.steps}",
                         "buffer.lifo=true", f"buffer.capacity={B}"]
    n = max(1, round(args.horizon * B / args.mu_plan))
    return common + [f"run.steps={args.buffer_steps}",
                     f"run.checkpoint_every={args.buffer_steps}",
                     f"buffer.capacity={n}", "buffer.sampling=with_replacement"]


def first_hit(records: list[dict], target: float) -> Hit | None:
    """The first evaluated record with held-out accuracy >= ``target`` (None if none)."""
    for r in records:
        acc = r.get("eval_accuracy")
        if acc is not None and acc >= target:
            return Hit(r["step"], r["wall_time"], r["wall_time"] - r["startup_seconds"],
                       r["samples_generated"])
    return None


def run_arm(arm: str, seed: int, args, out: str) -> RunResult:
    """Train one arm with one seed into ``out``."""
    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    load_before = os.getloadavg()[0]
    cfg = load_config("cpu_tiny", arm_overrides(arm, args) + [f"run.seed={seed}"])
    s = run_experiment(cfg, out)
    records = read_jsonl(os.path.join(out, "metrics.jsonl"))
    if args.delay > 0 and not s["injected_gen_delay_seconds"] > 0:
        raise RuntimeError("the injected delay was not applied (injected_gen_delay_seconds 0)")
    stale = [r["staleness_mean"] for r in records if r.get("staleness_mean") is not None]
    return RunResult(arm, seed, s["steps"], s["mu_measured"], s["injected_gen_delay_seconds"],
                     s["wall_time"], s["startup_seconds"], statistics.fmean(stale),
                     s["samples_consumed"] / s["samples_generated"],
                     s["warm_start_accuracy"], s["best_eval_accuracy"],
                     first_hit(records, args.target), load_before, os.getloadavg()[0])


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None if either is missing."""
    return None if a is None or b is None else a / b


def compare(results: list[RunResult], seeds: list[int]) -> dict:
    """Per seed and median: buffer / on-policy ratios of wall time (total and after start-up)
    and of compute to the target (None where an arm missed it)."""
    by = {(r.arm, r.seed): r.hit for r in results}
    keys = ("wall_seconds", "wall_after_startup", "compute")
    per_seed = {}
    for seed in seeds:
        onp, buf = by[("on_policy", seed)], by[("buffer", seed)]
        per_seed[seed] = {k: ratio(getattr(buf, k, None), getattr(onp, k, None)) for k in keys}
    median = {}
    for k in keys:
        vals = [v[k] for v in per_seed.values() if v[k] is not None]
        median[k] = statistics.median(vals) if vals else None
    return {"per_seed": per_seed, "median": median}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=150, help="on-policy trainer steps")
    p.add_argument("--buffer-steps", type=int, default=300, help="buffer trainer steps")
    p.add_argument("--delay", type=float, default=0.3,
                   help="injected median delay per sampler call, seconds")
    p.add_argument("--sigma", type=float, default=0.5, help="lognormal spread of the delay")
    p.add_argument("--horizon", type=float, default=8.0, help="buffer horizon x = N/R, steps")
    p.add_argument("--mu-plan", type=float, default=3.0,
                   help="mu the buffer capacity is planned for (N = x B / mu)")
    p.add_argument("--target", type=float, default=0.5, help="held-out accuracy target")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    from llm_experiments.engines.ray_engine import connect
    import ray
    tmp = tempfile.mkdtemp(prefix="claim8_")
    ours = connect(None)  # one local cluster for every run: start-up paid once
    results = []
    try:
        for i, seed in enumerate(args.seeds):
            for arm in (ARMS if i % 2 == 0 else ARMS[::-1]):
                results.append(run_arm(arm, seed, args, os.path.join(tmp, f"{arm}_{seed}")))
                print(f"{arm} seed {seed}: hit {results[-1].hit}, mu "
                      f"{results[-1].mu_measured:.2f}", flush=True)
    finally:
        if ours:
            ray.shutdown()
    mu_common = statistics.median(r.mu_measured for r in results)
    for r in results:
        if r.hit is not None:
            r.hit.compute = r.hit.step + mu_common * r.hit.generated / B
    table = [{"arm": r.arm, "seed": r.seed, "mu": r.mu_measured,
              "stale": r.staleness_mean, "y": r.replay_ratio_mean,
              "best": r.best_eval_accuracy,
              "t_target": r.hit.wall_seconds if r.hit else None,
              "t_after_start": r.hit.wall_after_startup if r.hit else None,
              "C_target": r.hit.compute if r.hit else None, "load": r.load_after}
             for r in results]
    print_table(table, list(table[0]))
    ratios = compare(results, args.seeds)
    print("buffer / on-policy:", ratios)
    write_result("claim8_wallclock", {
        "args": vars(args), "injected": {"median_seconds": args.delay, "sigma": args.sigma,
                                         "note": "artificial sampler delay (not real work)"},
        "buffer_capacity": max(1, round(args.horizon * B / args.mu_plan)),
        "mu_common": mu_common, "runs": [asdict(r) for r in results],
        "ratio_buffer_over_on_policy": ratios})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
