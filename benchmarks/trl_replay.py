"""TRL's plain ``GRPOTrainer`` against our ``ReplayGRPOTrainer`` at the calculator's design.

Run: ``python -m benchmarks.trl_replay [--steps 60] [--repeats 1] [--mu 6.84] [--alpha 0.2]``
(needs the ``trl`` extra). Writes ``benchmarks/results/trl_replay.json``.

Both train the cpu_tiny warm-started model (2-digit addition) through ``python -m
llm_experiments trl``'s path (``integrations.trl_run.build_trainer``), one torch thread,
the same lr, G = 8 and B = 64 rollouts per update:

* plain: on-policy, R = B = 64 new rollouts per update, each used once (``ReplaySettings``
  with ``on_policy``; TRL's own GRPOTrainer loop, with the behaviour log-probs stored);
* replay: ``optimal_config(mu, alpha, batch_size=B)`` mapped by ``trl_config`` (R rounded to
  whole groups of G, N keeping the horizon).

Measured: generated samples per second and updates per second of wall time (evaluation
excluded), and the compute to reach the target accuracy (``--target``, held-out, evaluated
every ``--eval-every`` steps) in units of one update, steps + mu * generated / B at the
accounting ``--mu`` (theory.md section 3), also with the measured mu of each run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from benchmarks.common import set_threads, write_result

B, G = 64, 8


def one_run(args, design: str, seed: int) -> dict:
    """One TRL run of ``design`` ("plain" or "replay"); its records and rates."""
    from llm_experiments.config import load_config
    from llm_experiments.integrations.trl import trl_config
    from llm_experiments.integrations.trl_run import run_trl
    from llm_experiments.metrics import read_jsonl
    from replaytheory.calculator import optimal_config
    sets = [f"run.steps={args.steps}", f"run.seed={seed}", f"trainer.lr={args.lr}",
            f"eval.every={args.eval_every}", "eval.pass_k_problems=0", "probe.every=0",
            "task.eval_size=1000", "run.progress=false", f"run.cache_dir={args.cache}",
            f"schedule.batch_size={B}", f"schedule.group_size={G}", "run.threads=1",
            f"schedule.mu_accounting={args.mu}"]
    if design == "plain":
        sets.append("schedule.mode=on_policy")
        extra = {}
    else:
        rec = optimal_config(mu=args.mu, alpha=args.alpha, batch_size=B)
        mapped = trl_config(rec, G)
        r = mapped.per_device_train_batch_size
        sets += ["schedule.mode=sync", f"schedule.replay_ratio={B / r!r}",
                 f"buffer.capacity={mapped.replay.buffer_size}"]
        extra = {"recommendation": rec.to_dict(), "rollouts_per_step": r,
                 "buffer_size": mapped.replay.buffer_size, "replay_ratio": B / r}
    with tempfile.TemporaryDirectory() as out:
        summary = run_trl(load_config("cpu_tiny", sets), os.path.join(out, "run"))
        recs = read_jsonl(os.path.join(out, "run", "metrics.jsonl"))
    train = [r for r in recs if r["step"] < args.steps]
    busy = summary["gen_seconds_per_step"] + summary["train_seconds_per_step"]
    evals = [(r["compute_units"], r["step"], r["eval_accuracy"]) for r in recs
             if r["eval_accuracy"] is not None]
    hit = next(((c, s) for c, s, a in evals if a >= args.target), (None, None))
    mu_m = summary["mu_measured"]
    hit_measured = None if hit[1] is None else \
        hit[1] + mu_m * next(r["samples_generated"] for r in recs if r["step"] == hit[1]) / B
    return {"samples_per_s": train[-1]["samples_generated"] / (busy * len(train)),
            "updates_per_s": 1.0 / busy, "mu_measured": mu_m,
            "warm_start_accuracy": summary["warm_start_accuracy"],
            "final_eval_accuracy": summary["final_eval_accuracy"],
            "best_eval_accuracy": summary["best_eval_accuracy"],
            "compute_to_target": hit[0], "step_to_target": hit[1],
            "compute_to_target_measured_mu": hit_measured,
            "samples_generated": summary["samples_generated"], "evals": evals, **extra}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="updates per run")
    parser.add_argument("--repeats", type=int, default=1, help="seeds per design")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between evals")
    parser.add_argument("--target", type=float, default=0.45, help="held-out accuracy target")
    parser.add_argument("--mu", type=float, default=6.84, help="accounting mu (the paper's)")
    parser.add_argument("--alpha", type=float, default=0.2, help="noise power-law alpha")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate, both")
    parser.add_argument("--cache", default=os.environ.get("LLM_EXPERIMENTS_CACHE", ".cache"),
                        help="warm-start cache folder")
    args = parser.parse_args(argv)
    set_threads(1)
    runs = {"plain": [], "replay": []}
    for seed in range(args.repeats):
        for design in runs:  # alternate, so that a busy machine slows both alike
            runs[design].append(one_run(args, design, seed))
            r = runs[design][-1]
            print(f"seed {seed} {design}: {r['samples_per_s']:.0f} samples/s, "
                  f"{r['updates_per_s']:.1f} updates/s, final acc "
                  f"{r['final_eval_accuracy']:.3f}, compute to {args.target}: "
                  f"{r['compute_to_target']}", flush=True)

    def med(design, key):
        vals = [r[key] for r in runs[design] if r[key] is not None]
        return statistics.median(vals) if vals else None
    result = {"settings": {**vars(args), "batch_size": B, "group_size": G,
                           "model": "cpu_tiny (warm-started), 1 thread"},
              "median": {d: {k: med(d, k) for k in ("samples_per_s", "updates_per_s",
                                                    "mu_measured", "final_eval_accuracy",
                                                    "compute_to_target",
                                                    "compute_to_target_measured_mu")}
                         for d in runs},
              "runs": runs}
    write_result("trl_replay", result)
    return result


if __name__ == "__main__":
    main()
