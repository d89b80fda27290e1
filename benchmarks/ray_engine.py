"""The Ray engine against the model, the serial harness and TRL (issue 12, items 3 and 6).

``python -m benchmarks.ray_engine [--steps 120] [--workers 1] [--trainers 1] [--threads 1]
[--repeats 5] [--overlap-steps 120]``

One Ray run of the cpu_tiny model (schedule.engine=ray, W sampler and T trainer actors, FIFO
buffer of N = buffer.capacity, no probes, evaluation only at the ends), then:

1. histograms (theory.md section 2): staleness, replay ratio and steps since last use of the
   Ray run against ``replaytheory.sim.pipeline_sim.simulate_pipeline`` for the same (W, T, N,
   chunk, refresh) at two values of mu: ``mu_measured`` (seconds generating B rollouts over
   seconds of one update, compute only) and ``mu_effective`` = B W / (T R), R the rollouts
   the run really made per step (every overhead included: weight transfer, the driver,
   scheduling, CPU contention); and against the emulated engine run at
   ``mu_accounting = mu_effective`` (its rate, B W / (T mu), is then the Ray run's).
   Reported: mean and quantiles 0.1 / 0.5 / 0.9 of each histogram, and their differences.
2. throughput: samples trained and generated per second in the steady state (from the first
   logged step to the last; start-up and the two evaluations excluded) of the Ray run, of
   the emulated (serial) engine making the same rollouts per step, and of TRL's own
   ``GRPOTrainer`` (``integrations.trl_run.run_trl(plain=True)``: on-policy, B fresh rollouts
   per step, each trained on once; needs the ``bench`` extra), measured one after the other in
   this process with the same steps and threads; ratios Ray / serial and Ray / TRL.

3. overlap (issue 27, item 4): ``--repeats`` alternating pairs, serial then Ray (serial, ray,
   serial, ray, ...), of ``--overlap-steps`` steps at mu near 1 in the rollouts sense: each
   rollout used about once, B new rollouts per update. Both use the LIFO queue of
   capacity 2B (``buffer.lifo=true``; the Ray sampler waits while the queue could not take
   its chunk, so it makes about B per step however fast it is) with W = T = 1; the serial
   arm is the emulated engine at ``schedule.mu_accounting=1`` (R = B W / (T mu) = B per
   step), the Ray arm the Ray engine, whose sampler and trainer actors overlap. Per repeat:
   steady-state samples trained and generated per second (``steady_rate``), rollouts per
   step and the measured mu (generation seconds of B over update seconds) of each arm, and
   the ratios Ray / serial; over repeats: median, min and max of each ratio. Each run also
   keeps its profile (``PROFILE_KEYS``: seconds generating and updating per step; on Ray the
   actors' busy and idle seconds and the driver's wait for data), which shows what
   serialises the actors when the ratio falls short. With measured
   mu m the overlap can at best give (1 + m) / max(1, m) (serial: generation plus update;
   overlapped: the longer of the two), reported as ``ideal_ratio`` per repeat.

Writes ``benchmarks/results/ray_engine.json`` (``--result`` to change the name).
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

from benchmarks.common import print_table, spread, write_result

CACHE = os.environ.get("LLM_EXPERIMENTS_CACHE") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache")
QUANTILES = (0.1, 0.5, 0.9)


def hist_summary(hist: dict) -> dict:
    """Mean and quantiles of a {value: count} histogram (the "new" bin of steps since last use
    is left out and reported as ``new_fraction``)."""
    counts = {k: v for k, v in hist.items() if k != "new"}
    values = np.repeat([float(k) for k in counts], [int(v) for v in counts.values()])
    total = sum(hist.values())
    out = {"count": int(total), "mean": float(values.mean()) if values.size else None}
    for q in QUANTILES:
        out[f"q{int(q * 100)}"] = float(np.quantile(values, q)) if values.size else None
    if "new" in hist:
        out["new_fraction"] = hist["new"] / total
    return out


def steady_rate(records: list[dict]) -> dict:
    """Samples trained and generated per second between the first and last step records."""
    rows = [r for r in records if r.get("samples_consumed") is not None]
    a, b = rows[1], rows[-2]  # after the first step (start-up), before the final evaluation
    wall = b["wall_time"] - a["wall_time"]
    return {"seconds": wall, "steps": b["step"] - a["step"],
            "trained_per_s": (b["samples_consumed"] - a["samples_consumed"]) / wall,
            "generated_per_s": (b["samples_generated"] - a["samples_generated"]) / wall}


def run(out: str, overrides: list[str], trl: bool = False) -> tuple[dict, list[dict]]:
    """A run of cpu_tiny with ``overrides`` into ``out`` (with TRL's ``GRPOTrainer`` if
    ``trl``): (summary, metrics records)."""
    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    cfg = load_config("cpu_tiny", overrides)
    if trl:
        from llm_experiments.integrations.trl_run import run_trl
        summary = run_trl(cfg, out, plain=True)
    else:
        summary = run_experiment(cfg, out)
    return summary, read_jsonl(os.path.join(out, "metrics.jsonl"))


OVERLAP_ARMS = ("serial", "ray")
# Summary fields kept per overlap run, the profile of where the time went (the Ray engine's
# actor busy / idle seconds and the driver's wait for data exist only on Ray).
PROFILE_KEYS = ("gen_seconds_per_step", "train_seconds_per_step", "busy_seconds",
                "idle_seconds", "data_wait_seconds", "startup_seconds")


def overlap_overrides(arm: str, steps: int, threads: int) -> list[str]:
    """cpu_tiny overrides of one arm of the overlap comparison (item 3 of the docstring)."""
    b = 64  # cpu_tiny's schedule.batch_size
    sets = [f"run.steps={steps}", f"eval.every={steps}", "eval.pass_k_problems=0",
            "probe.every=0", "run.progress=false", f"run.threads={threads}",
            f"run.cache_dir={CACHE}", f"run.checkpoint_every={steps}", "schedule.mode=async",
            "schedule.workers=1", "schedule.trainers=1", "buffer.lifo=true",
            f"buffer.capacity={2 * b}"]
    if arm == "serial":
        return sets + ["schedule.mu_accounting=1.0"]
    if arm == "ray":
        return sets + ["schedule.engine=ray"]
    raise ValueError(f"arm must be one of {OVERLAP_ARMS}, got {arm!r}")


def overlap_repeats(repeats: int, steps: int, threads: int, tmp: str) -> dict:
    """``repeats`` alternating (serial, ray) pairs (item 3 of the docstring): per repeat and
    arm the steady rates, rollouts per step, measured mu and load; the ratios Ray / serial
    per repeat and their median, min and max."""
    rows = []
    for i in range(repeats):
        row = {"repeat": i}
        for arm in OVERLAP_ARMS:
            load = os.getloadavg()[0]
            summary, records = run(os.path.join(tmp, f"overlap_{arm}_{i}"),
                                   overlap_overrides(arm, steps, threads))
            m = summary["mu_measured"]
            row[arm] = {**steady_rate(records), "load_before": load,
                        "load_after": os.getloadavg()[0], "mu_measured": m,
                        "rollouts_per_step": summary["samples_generated"] / summary["steps"],
                        "ideal_ratio": (1 + m) / max(1.0, m),
                        **{k: summary[k] for k in PROFILE_KEYS if k in summary}}
        for kind in ("trained", "generated"):
            row[f"ratio_{kind}"] = row["ray"][f"{kind}_per_s"] / row["serial"][f"{kind}_per_s"]
        print(f"repeat {i}: ray/serial trained {row['ratio_trained']:.3f}, generated "
              f"{row['ratio_generated']:.3f}; R serial {row['serial']['rollouts_per_step']:.1f},"
              f" ray {row['ray']['rollouts_per_step']:.1f}", flush=True)
        rows.append(row)
    return {"repeats": rows,
            **{f"ratio_{kind}": spread([r[f"ratio_{kind}"] for r in rows])
               for kind in ("trained", "generated")},
            "ideal_ratio_serial_mu": spread([r["serial"]["ideal_ratio"] for r in rows])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--trainers", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5, help="serial/ray pairs of the overlap")
    p.add_argument("--overlap-steps", type=int, default=120, help="steps per overlap run")
    p.add_argument("--result", default="ray_engine", help="benchmarks/results/<name>.json")
    args = p.parse_args(argv)
    from replaytheory.sim.pipeline_sim import simulate_pipeline
    common = [f"run.steps={args.steps}", f"eval.every={args.steps}", "eval.pass_k_problems=0",
              "probe.every=0", "run.progress=false", f"run.threads={args.threads}",
              f"run.cache_dir={CACHE}", "schedule.mode=async",
              f"schedule.workers={args.workers}", f"schedule.trainers={args.trainers}",
              f"run.checkpoint_every={args.steps}"]
    tmp = tempfile.mkdtemp(prefix="ray_engine_bench_")
    # 1-minute load averages before and after each contender: a shared machine's load moves.
    loads = {"ray": [os.getloadavg()[0]]}
    ray_sum, ray_rec = run(os.path.join(tmp, "ray"), common + ["schedule.engine=ray"])
    loads["ray"].append(os.getloadavg()[0])
    sc_b = 64  # cpu_tiny's schedule.batch_size
    n = 512  # cpu_tiny's buffer.capacity
    rate = ray_sum["samples_generated"] / ray_sum["steps"]
    mu_eff = sc_b * args.workers / (args.trainers * rate)
    chunk = ray_sum["schedule"]["chunk_groups"] * 8
    sims = {}
    for name, mu in (("sim_mu_measured", ray_sum["mu_measured"]), ("sim_mu_effective", mu_eff)):
        res = simulate_pipeline(workers=args.workers, trainers=args.trainers, mu=mu,
                                batch_size=sc_b, buffer_size=n,
                                rollouts=ray_sum["samples_generated"], chunk=chunk)
        sims[name] = {"mu": mu, "steps": res.steps, "histograms": res.histograms}
    loads["emulated_serial"] = [os.getloadavg()[0]]
    emu_sum, emu_rec = run(os.path.join(tmp, "emulated"),
                           common + [f"schedule.mu_accounting={mu_eff:.6g}"])
    sources = {"ray": {"mu": ray_sum["mu_measured"], "steps": ray_sum["steps"],
                       "histograms": ray_sum["histograms"]},
               **sims,
               "emulated": {"mu": mu_eff, "steps": emu_sum["steps"],
                            "histograms": emu_sum["histograms"]}}
    table, hist = [], {}
    for src, data in sources.items():
        hist[src] = {axis: hist_summary(h) for axis, h in data["histograms"].items()}
        for axis, s in hist[src].items():
            table.append({"source": src, "axis": axis, "mu": data["mu"], **s})
    diffs = {src: {axis: {k: (None if hist[src][axis][k] is None or hist["ray"][axis][k] is None
                              else hist[src][axis][k] - hist["ray"][axis][k])
                          for k in ("mean", "q10", "q50", "q90")}
                   for axis in hist["ray"]} for src in hist if src != "ray"}
    print_table(table, ["source", "axis", "mu", "count", "mean", "q10", "q50", "q90"])
    trl_common = [c for c in common if not c.startswith("schedule.")]
    loads["emulated_serial"].append(os.getloadavg()[0])
    loads["trl_grpo"] = [os.getloadavg()[0]]
    trl_sum, trl_rec = run(os.path.join(tmp, "trl"), trl_common + ["schedule.mode=on_policy"],
                           trl=True)
    loads["trl_grpo"].append(os.getloadavg()[0])
    rates = {"ray": steady_rate(ray_rec), "emulated_serial": steady_rate(emu_rec),
             "trl_grpo": steady_rate(trl_rec)}
    for name, (before, after) in loads.items():
        rates[name].update(load_before=before, load_after=after)
    throughput = dict(rates)
    for other in ("emulated_serial", "trl_grpo"):
        for kind in ("trained", "generated"):
            throughput[f"ratio_{kind}_vs_{other}"] = rates["ray"][f"{kind}_per_s"] / \
                rates[other][f"{kind}_per_s"]
    print_table([{"contender": k, **v} for k, v in rates.items()],
                ["contender", "seconds", "steps", "trained_per_s", "generated_per_s",
                 "load_before", "load_after"])
    print({k: v for k, v in throughput.items() if k.startswith("ratio")})
    overlap = overlap_repeats(args.repeats, args.overlap_steps, args.threads, tmp)
    print({k: v for k, v in overlap.items() if k != "repeats"})
    write_result(args.result, {
        "args": vars(args), "mu_measured": ray_sum["mu_measured"], "mu_effective": mu_eff,
        "rollouts_per_step": rate, "busy_seconds": ray_sum["busy_seconds"],
        "idle_seconds": ray_sum["idle_seconds"], "histogram_summaries": hist,
        "differences_vs_ray": diffs, "throughput": throughput, "overlap": overlap,
        "accuracy": {"ray": [ray_sum["warm_start_accuracy"], ray_sum["best_eval_accuracy"]],
                     "emulated": [emu_sum["warm_start_accuracy"],
                                  emu_sum["best_eval_accuracy"]],
                     "trl_grpo": [trl_sum["warm_start_accuracy"],
                                  trl_sum["best_eval_accuracy"]]}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
