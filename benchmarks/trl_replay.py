"""TRL's own ``trl.GRPOTrainer`` against our ``ReplayGRPOTrainer`` at the calculator's design.

Run: ``python -m benchmarks.trl_replay [--steps 100] [--seeds 3] [--mu 6.84] [--alpha 0.05] [--reuse 0.67]``
(needs the ``trl`` extra). Writes ``benchmarks/results/trl_replay.json``.

Both arms train the cpu_tiny warm-started model (2-digit addition) through ``python -m
llm_experiments trl``'s path (``integrations.trl_run.run_trl``) with the same GRPOConfig
(B = 64 rollouts per update, G = 8, lr, steps, seed), prompts and reward, one torch thread:

* plain: TRL's ``trl.GRPOTrainer`` itself (``run_trl(plain=True)``; the class unmodified,
  TRL's default handling of old log-probs: none stored, ratio 1), R = B = 64 new rollouts
  per update, each used once;
* replay: ``ReplayGRPOTrainer`` at ``trl_config(optimal_config(mu, alpha, batch_size=B,
  reuse=c), G)`` (c: the calculator's default self-correlation unless ``--reuse``)
  (R rounded to whole groups of G, N keeping the horizon; theory.md sections 1-3, 5).

Per seed the arms run back to back (seed 0 plain, seed 0 replay, seed 1 plain, ...) so that
machine load affects both alike; the load average at start and end is saved. Measured per run
and as the median over seeds: generated samples/s and updates/s of training wall time
(evaluation excluded), the held-out accuracy (``--eval-every`` steps, the harness's
evaluation, both arms), and the compute to reach ``--target`` in units of one update,
steps + mu * generated / B (theory.md section 3.6, interpolated between evaluations as in
section 8.3), at the accounting ``--mu`` and at each run's measured mu.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass, field

from benchmarks.common import set_threads, write_result
from replaytheory.calculator import DEFAULT_REUSE

B, G = 64, 8
ARMS = ("plain", "replay")
# ArmRun fields summarised by their median over seeds.
MEDIAN_KEYS = ("samples_per_s", "updates_per_s", "mu_measured", "final_eval_accuracy",
               "best_eval_accuracy", "compute_to_target", "compute_to_target_measured_mu")


@dataclass
class ArmRun:
    """One TRL run of one arm. Rates per second of training wall time (generation plus
    updates, evaluation excluded); compute in updates (theory.md section 3.6), None when the
    target was not reached; evals: (step, samples generated, held-out accuracy) per
    evaluation."""

    arm: str
    seed: int
    trainer: str
    samples_per_s: float
    updates_per_s: float
    mu_measured: float | None
    warm_start_accuracy: float
    final_eval_accuracy: float
    best_eval_accuracy: float
    step_to_target: int | None
    compute_to_target: float | None
    compute_to_target_measured_mu: float | None
    samples_generated: int
    rollouts_per_step: float
    evals: list = field(default_factory=list)


def arm_overrides(arm: str, settings, seed: int) -> list[str]:
    """The ``--set`` overrides of cpu_tiny for ``arm`` ("plain" or "replay")."""
    from llm_experiments.integrations.trl import trl_config
    from replaytheory.calculator import optimal_config
    sets = [f"run.steps={settings.steps}", f"run.seed={seed}", f"trainer.lr={settings.lr}",
            f"eval.every={settings.eval_every}", "eval.pass_k_problems=0", "probe.every=0",
            "run.progress=false", f"run.cache_dir={settings.cache}", f"schedule.batch_size={B}",
            f"schedule.group_size={G}", "run.threads=1",
            f"schedule.mu_accounting={settings.mu}"]
    if arm == "plain":
        return sets + ["schedule.mode=on_policy"]
    if arm != "replay":
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    mapped = trl_config(optimal_config(mu=settings.mu, alpha=settings.alpha, batch_size=B,
                                       reuse=settings.reuse), G)
    r = mapped.per_device_train_batch_size
    return sets + ["schedule.mode=sync", f"schedule.replay_ratio={B / r!r}",
                   f"buffer.capacity={mapped.replay.buffer_size}"]


def compute_to(evals: list, mu: float | None, target: float) -> float | None:
    """Compute (updates, steps + mu * generated / B) to first reach ``target``, interpolated
    between evaluations (theory.md sections 3.6, 8.3); None if never reached."""
    from replaytheory.stats.analysis import compute_to_target
    if mu is None:
        return None
    c = compute_to_target([s + mu * n / B for s, n, _ in evals], [a for _, _, a in evals],
                          target, interpolate=True)
    return None if math.isinf(c) else c


def one_run(settings, arm: str, seed: int, extra_overrides=()) -> ArmRun:
    """Train ``arm`` at ``seed`` (cpu_tiny with ``arm_overrides``, then ``extra_overrides``)
    and measure it."""
    from llm_experiments.config import load_config
    from llm_experiments.integrations.trl_run import run_trl
    from llm_experiments.engines.metrics import read_jsonl
    cfg = load_config("cpu_tiny", arm_overrides(arm, settings, seed) + list(extra_overrides))
    with tempfile.TemporaryDirectory() as out:
        s = run_trl(cfg, os.path.join(out, "run"), plain=arm == "plain")
        recs = read_jsonl(os.path.join(out, "run", "metrics.jsonl"))
    evals = [(r["step"], r["samples_generated"], r["eval_accuracy"]) for r in recs
             if r["eval_accuracy"] is not None]
    busy = s["steps"] * (s["gen_seconds_per_step"] + s["train_seconds_per_step"])
    hit = next((st for st, _, a in evals if a >= settings.target), None)
    return ArmRun(arm=arm, seed=seed, trainer=s["trainer"],
                  samples_per_s=s["samples_generated"] / busy, updates_per_s=s["steps"] / busy,
                  mu_measured=s["mu_measured"], warm_start_accuracy=s["warm_start_accuracy"],
                  final_eval_accuracy=s["final_eval_accuracy"],
                  best_eval_accuracy=s["best_eval_accuracy"], step_to_target=hit,
                  compute_to_target=compute_to(evals, settings.mu, settings.target),
                  compute_to_target_measured_mu=compute_to(evals, s["mu_measured"],
                                                           settings.target),
                  samples_generated=s["samples_generated"],
                  rollouts_per_step=s["rollouts_per_step"], evals=evals)


def median_of(runs: list[ArmRun], key: str) -> float | None:
    """Median of ``key`` over seeds; a target never reached counts as infinite compute (so
    the median is None when most runs missed it)."""
    vals = [getattr(r, key) for r in runs]
    if key.startswith("compute_to_target"):
        vals = [math.inf if x is None else x for x in vals]
    vals = [x for x in vals if x is not None]
    med = statistics.median(vals) if vals else None
    return None if med is None or math.isinf(med) else med


def parse(argv=None):
    """The command's settings."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="updates per run")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per arm")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between evals")
    parser.add_argument("--target", type=float, default=0.45, help="held-out accuracy target")
    parser.add_argument("--mu", type=float, default=6.84, help="accounting mu (the paper's)")
    # alpha 0.2 with the default c is an on-policy design: no replay arm to compare.
    parser.add_argument("--alpha", type=float, default=0.05, help="noise power-law alpha")
    parser.add_argument("--reuse", type=float, default=DEFAULT_REUSE.c,
                        help="self-correlation c of the calculator (theory.md section 10.11; "
                             "0: section 5's model, as trl_replay.json of 2026-12-03 used)")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate, both arms")
    parser.add_argument("--cache", default=os.environ.get("LLM_EXPERIMENTS_CACHE", ".cache"),
                        help="warm-start cache folder")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    settings = parse(argv)
    set_threads(1)
    load_start = os.getloadavg()
    runs = {arm: [] for arm in ARMS}
    for seed in range(settings.seeds):
        for arm in ARMS:  # back to back, so that a busy machine slows both alike
            r = one_run(settings, arm, seed)
            runs[arm].append(r)
            print(f"seed {seed} {arm} ({r.trainer}): {r.samples_per_s:.0f} samples/s, "
                  f"{r.updates_per_s:.2f} updates/s, mu {r.mu_measured:.2f}, acc "
                  f"{r.warm_start_accuracy:.3f} -> {r.final_eval_accuracy:.3f} (best "
                  f"{r.best_eval_accuracy:.3f}), compute to {settings.target}: "
                  f"{r.compute_to_target}", flush=True)
    result = {"settings": {**vars(settings), "batch_size": B, "group_size": G,
                           "model": "cpu_tiny (warm-started), 1 thread"},
              "machine_load": {"loadavg_start": list(load_start),
                               "loadavg_end": list(os.getloadavg()),
                               "note": "os.getloadavg() (1, 5, 15 min) at start and end; "
                                       "the arms alternate per seed"},
              "median": {arm: {k: median_of(rs, k) for k in MEDIAN_KEYS}
                         for arm, rs in runs.items()},
              "reached_target": {arm: sum(r.compute_to_target is not None for r in rs)
                                 for arm, rs in runs.items()},
              "runs": {arm: [asdict(r) for r in rs] for arm, rs in runs.items()}}
    write_result("trl_replay", result)
    return result


if __name__ == "__main__":
    main()
