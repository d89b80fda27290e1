"""TRL's own ``trl.GRPOTrainer`` against our ``ReplayGRPOTrainer`` at three replay designs
(issue 27, item 3: "TRL, fairly").

Run (the full benchmark; needs the ``trl`` extra): ``python -m benchmarks.trl_replay``
(defaults: ``--steps 100 --seeds 5 --lrs 1e-4 2e-4 --mu 6.84 --alpha 0.05 --target 0.45
--eval-every 10``). A smoke run: ``--steps 4 --seeds 1 --lrs 1e-4 --eval-every 2 --result
trl_replay_smoke``. Writes ``benchmarks/results/<--result>.json`` (atomically).

Every arm trains the cpu_tiny warm-started model (2-digit addition) through ``python -m
llm_experiments trl``'s path (``integrations.trl_run.run_trl``) with the same GRPOConfig
(B = 64 rollouts per update, G = 8, lr, steps, seed), prompts and reward, one torch thread,
and the same generation batch: 64 rollouts in one generation call.

* ``plain``: TRL's ``trl.GRPOTrainer`` itself (the class unmodified, TRL's default handling of
  old log-probs: none stored, ratio 1): R = B = 64 new rollouts per update, each used once.
* ``calculator``: the reuse-aware design a user gets from ``replaytheory.calculator.
  optimal_config(mu, alpha, batch_size=B, run_updates=--steps)`` (section 10's objective at
  the default self-correlation c = 0.67, ``DEFAULT_REUSE``; horizon x = the measured best for
  a run of that length, ``measured_horizon``: 8 updates at 100 steps, 64 at 300; the model
  picks y).
* ``x64_sqrt_mu``: the rule x = N/R = 64 updates, y = B/R = sqrt(mu) at the accounting mu.
* ``section5``: section 5's model, ``optimal_config(..., reuse=None, horizon_source="model")``
  (each use a fresh noise draw, the model's own horizon).

Equal generation batches: TRL's generation batch is GRPOConfig ``generation_batch_size`` =
``per_device_train_batch_size`` x ``steps_per_generation``; plain's is 64 x 1. A replay arm
generates R rollouts per update on average, so it runs ``steps_per_generation`` k = 64 / R:
one generation of 64 rollouts every k updates (``integrations.trl.GenerationBatches``). R is
therefore the multiple of G dividing 64 nearest to the design's R (log scale: 8, 16, 32 or
64, i.e. y = 8, 4, 2 or 1) and N = round(x R) keeps the design's horizon; the JSON records the
design's x, y, R and the realised ones.

Learning rates: ``--lrs`` (default the benchmark's former lr 1e-4, the harness's cpu_tiny
rate, and 2e-4, the "lr2" grids of results/horizon_lr2); 1e-3 collapsed on this task
(platform notes), so 2x is the step that stays stable.

Order: per seed, per lr, the four arms back to back (seed 0 lr 1 plain, calculator,
x64_sqrt_mu, section5, seed 0 lr 2 plain, ...), so machine load affects every arm alike; the
load average at start and end is saved.

Measured per run: generated samples/s and updates/s of training wall time (generation plus
updates, evaluation excluded); the held-out accuracy every ``--eval-every`` steps (the
harness's evaluation, every arm); and, to first reach ``--target`` (interpolated between
evaluations, section 8.3): compute in updates, steps + mu * generated / B (section 3.6), at the
accounting ``--mu`` and at the run's own measured mu, and training seconds. The counts of an
evaluation are those of the weights it evaluated (after s updates, before update s's
generation). Per lr and arm: median, min and max over seeds of each measure (a target never
reached counts as infinite; a median that is infinite is null) and how many seeds reached
the target; per lr and measure, the arms ranked by median (``ranking``: first = wins).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field

from benchmarks.common import set_threads, spread, write_result
from replaytheory import checks

B, G = 64, 8
PLAIN = "plain"
DESIGNS = ("calculator", "x64_sqrt_mu", "section5")
ARMS = (PLAIN, *DESIGNS)
RULE_HORIZON = 64.0  # x of the "x = 64, y = sqrt(mu)" rule, in updates
# ArmRun fields summarised over seeds; RANKED: lower is better, arms ranked by median.
SUMMARY_KEYS = ("samples_per_s", "updates_per_s", "mu_measured", "final_eval_accuracy",
                "best_eval_accuracy", "compute_to_target", "compute_to_target_measured_mu",
                "seconds_to_target")
RANKED = ("compute_to_target", "compute_to_target_measured_mu", "seconds_to_target")


@dataclass(frozen=True)
class ArmDesign:
    """What a replay arm runs. design_horizon / design_replay_ratio / design_rollouts: the
    design's x = N/R (updates), y = B/R and R before rounding; rollouts_per_step R (a multiple
    of G dividing the generation batch), buffer_size N and steps_per_generation k = generation
    batch / R: what TRL runs; horizon, replay_ratio: the realised x and y."""

    arm: str
    design_horizon: float
    design_replay_ratio: float
    design_rollouts: float
    rollouts_per_step: int
    buffer_size: int
    steps_per_generation: int
    horizon: float
    replay_ratio: float


def equal_generation(arm: str, horizon: float, rollouts: float, generation_batch: int = B
                     ) -> ArmDesign:
    """The design (x = ``horizon`` updates >= 1, R = ``rollouts`` > 0) run with TRL's
    generation batch ``generation_batch`` (a multiple of G): R becomes the multiple of G
    dividing it nearest to ``rollouts`` in log scale, N = max(B, round(x R))."""
    checks.real("horizon", horizon, 1.0)
    checks.positive("rollouts", rollouts)
    fits = [r for r in range(G, generation_batch + 1, G) if generation_batch % r == 0]
    r = min(fits, key=lambda c: abs(math.log(c / rollouts)))
    n = max(B, int(round(horizon * r)))
    return ArmDesign(arm=arm, design_horizon=horizon, design_replay_ratio=B / rollouts,
                     design_rollouts=rollouts, rollouts_per_step=r, buffer_size=n,
                     steps_per_generation=generation_batch // r, horizon=n / r,
                     replay_ratio=B / r)


def arm_design(arm: str, settings) -> ArmDesign:
    """The ``ArmDesign`` of replay arm ``arm`` (one of ``DESIGNS``) at ``settings``' mu,
    alpha and steps (see the module docstring)."""
    from replaytheory.calculator import optimal_config
    if arm == "x64_sqrt_mu":
        return equal_generation(arm, RULE_HORIZON, B / math.sqrt(settings.mu))
    if arm == "calculator":
        rec = optimal_config(mu=settings.mu, alpha=settings.alpha, batch_size=B,
                             run_updates=settings.steps)
    elif arm == "section5":
        rec = optimal_config(mu=settings.mu, alpha=settings.alpha, batch_size=B, reuse=None,
                             horizon_source="model")
    else:
        raise ValueError(f"arm must be one of {DESIGNS}, got {arm!r}")
    return equal_generation(arm, rec.horizon, rec.rollouts_per_step)


@dataclass(frozen=True)
class EvalPoint:
    """One held-out evaluation of the weights after ``step`` updates, with what they cost:
    rollouts generated and training seconds (generation + updates) up to then."""

    step: int
    samples_generated: int
    seconds: float
    accuracy: float


@dataclass
class ArmRun:
    """One TRL run of one arm at one seed and lr. Rates per second of training wall time
    (generation plus updates, evaluation excluded); compute in updates (theory.md section
    3.6) and seconds to the target, None when the target was not reached; train_seconds:
    generation plus updates; run_seconds: the whole run (model load, evaluations)."""

    arm: str
    seed: int
    lr: float
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
    seconds_to_target: float | None
    train_seconds: float
    run_seconds: float
    samples_generated: int
    rollouts_per_step: float
    evals: list = field(default_factory=list)


def arm_overrides(arm: str, settings, seed: int, lr: float) -> list[str]:
    """The ``--set`` overrides of cpu_tiny for ``arm`` (one of ``ARMS``)."""
    sets = [f"run.steps={settings.steps}", f"run.seed={seed}", f"trainer.lr={lr!r}",
            f"eval.every={settings.eval_every}", "eval.pass_k_problems=0", "probe.every=0",
            "run.progress=false", f"run.cache_dir={settings.cache}", f"schedule.batch_size={B}",
            f"schedule.group_size={G}", "run.threads=1", "run.log_every=1",
            f"schedule.mu_accounting={settings.mu}"]
    if arm == PLAIN:
        return sets + ["schedule.mode=on_policy"]
    d = arm_design(arm, settings)
    return sets + ["schedule.mode=sync", f"schedule.replay_ratio={d.replay_ratio!r}",
                   f"buffer.capacity={d.buffer_size}"]


def eval_points(records: list[dict]) -> list[EvalPoint]:
    """The evaluations of a run's metrics.jsonl records. Record s holds the evaluation of
    the weights after s updates but the counters after update s (``trl_run.HarnessLog``), so
    an evaluation's counts are read from record s - 1 (none before the first update): one
    record per step is needed (run.log_every=1)."""
    by_step = {r["step"]: r for r in records}
    points = []
    for r in records:
        if r["eval_accuracy"] is None:
            continue
        s = r["step"]
        if s == 0:
            points.append(EvalPoint(step=0, samples_generated=0, seconds=0.0,
                                    accuracy=r["eval_accuracy"]))
            continue
        if s - 1 not in by_step:
            raise ValueError(f"no record of step {s - 1}: eval_points needs run.log_every=1")
        prev = by_step[s - 1]
        points.append(EvalPoint(step=s, samples_generated=prev["samples_generated"],
                                seconds=prev["gen_seconds"] + prev["train_seconds"],
                                accuracy=r["eval_accuracy"]))
    return points


def first_reach(cost: list[float], points: list[EvalPoint], target: float) -> float | None:
    """``cost`` (one value per evaluation) at which the accuracy first reaches ``target``,
    interpolated between evaluations (theory.md section 8.3); None if never reached."""
    from replaytheory.stats.analysis import compute_to_target
    c = compute_to_target(cost, [p.accuracy for p in points], target, interpolate=True)
    return None if math.isinf(c) else c


def compute_to(points: list[EvalPoint], mu: float | None, target: float) -> float | None:
    """Compute (updates, steps + mu * generated / B, section 3.6) to first reach ``target``;
    None if never reached or mu unknown."""
    if mu is None:
        return None
    return first_reach([p.step + mu * p.samples_generated / B for p in points], points, target)


def one_run(settings, arm: str, seed: int, lr: float, extra_overrides=()) -> ArmRun:
    """Train ``arm`` at ``seed`` and ``lr`` (cpu_tiny with ``arm_overrides``, then
    ``extra_overrides``) and measure it."""
    from llm_experiments.config import load_config
    from llm_experiments.engines.metrics import read_jsonl
    from llm_experiments.integrations.trl_run import run_trl
    cfg = load_config("cpu_tiny", arm_overrides(arm, settings, seed, lr) + list(extra_overrides))
    k = 1 if arm == PLAIN else arm_design(arm, settings).steps_per_generation
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        s = run_trl(cfg, os.path.join(out, "run"), plain=arm == PLAIN, steps_per_generation=k)
        points = eval_points(read_jsonl(os.path.join(out, "run", "metrics.jsonl")))
    busy = s["steps"] * (s["gen_seconds_per_step"] + s["train_seconds_per_step"])
    return ArmRun(arm=arm, seed=seed, lr=lr, trainer=s["trainer"],
                  samples_per_s=s["samples_generated"] / busy, updates_per_s=s["steps"] / busy,
                  mu_measured=s["mu_measured"], warm_start_accuracy=s["warm_start_accuracy"],
                  final_eval_accuracy=s["final_eval_accuracy"],
                  best_eval_accuracy=s["best_eval_accuracy"],
                  step_to_target=next((p.step for p in points
                                       if p.accuracy >= settings.target), None),
                  compute_to_target=compute_to(points, settings.mu, settings.target),
                  compute_to_target_measured_mu=compute_to(points, s["mu_measured"],
                                                           settings.target),
                  seconds_to_target=first_reach([p.seconds for p in points], points,
                                                settings.target),
                  train_seconds=busy, run_seconds=time.perf_counter() - t0,
                  samples_generated=s["samples_generated"],
                  rollouts_per_step=s["rollouts_per_step"], evals=points)


def summary_of(runs: list[ArmRun], key: str) -> dict:
    """{"median", "min", "max"} of ``key`` over seeds (a target never reached counts as
    infinite, an infinite statistic is None) and ``n``, the runs with a value."""
    vals = [getattr(r, key) for r in runs]
    if key in RANKED:
        vals = [math.inf if v is None else v for v in vals]
    vals = [v for v in vals if v is not None]
    stats = spread(vals) if vals else dict.fromkeys(("min", "median", "max"))
    return {**{k: None if v is not None and math.isinf(v) else v for k, v in stats.items()},
            "n": sum(v is not None and not math.isinf(v) for v in vals)}


def ranking(summary: dict) -> dict:
    """Per ``RANKED`` measure, the arms by median (lowest first; arms with no median last)."""
    return {key: sorted(summary, key=lambda arm: (summary[arm][key]["median"] is None,
                                                  summary[arm][key]["median"] or 0.0))
            for key in RANKED}


def parse(argv=None):
    """The command's settings (defaults: the full benchmark)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="updates per run")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per arm and lr")
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-4, 2e-4],
                        help="learning rates, every arm")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS,
                        help="arms to run (default all)")
    parser.add_argument("--eval-every", type=int, default=10, help="steps between evals")
    parser.add_argument("--target", type=float, default=0.45, help="held-out accuracy target")
    parser.add_argument("--mu", type=float, default=6.84, help="accounting mu (the paper's)")
    parser.add_argument("--alpha", type=float, default=0.05,
                        help="noise power-law alpha of the calculator's designs")
    parser.add_argument("--cache", default=os.environ.get("LLM_EXPERIMENTS_CACHE", ".cache"),
                        help="warm-start cache folder")
    parser.add_argument("--result", default="trl_replay",
                        help="result name: benchmarks/results/<name>.json")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    settings = parse(argv)
    set_threads(1)
    designs = {arm: asdict(arm_design(arm, settings)) for arm in settings.arms if arm != PLAIN}
    load_start = os.getloadavg()
    runs: list[ArmRun] = []
    for seed in range(settings.seeds):
        for lr in settings.lrs:
            for arm in settings.arms:  # back to back, so that load slows every arm alike
                r = one_run(settings, arm, seed, lr)
                runs.append(r)
                print(f"seed {seed} lr {lr:g} {arm} ({r.trainer}): {r.samples_per_s:.0f} "
                      f"samples/s, mu {r.mu_measured:.2f}, acc {r.warm_start_accuracy:.3f} -> "
                      f"{r.final_eval_accuracy:.3f} (best {r.best_eval_accuracy:.3f}), to "
                      f"{settings.target}: compute {r.compute_to_target}, seconds "
                      f"{r.seconds_to_target}", flush=True)
    by_lr = {}
    for lr in settings.lrs:
        summary = {arm: {k: summary_of([r for r in runs if r.arm == arm and r.lr == lr], k)
                         for k in SUMMARY_KEYS} for arm in settings.arms}
        by_lr[repr(lr)] = {"summary": summary, "ranking": ranking(summary)}
    result = {"settings": {**vars(settings), "batch_size": B, "group_size": G,
                           "generation_batch": B,
                           "model": "cpu_tiny (warm-started), 1 thread"},
              "designs": designs,
              "machine_load": {"loadavg_start": list(load_start),
                               "loadavg_end": list(os.getloadavg()),
                               "note": "os.getloadavg() (1, 5, 15 min) at start and end; "
                                       "the arms alternate per seed and lr"},
              "by_lr": by_lr, "runs": [asdict(r) for r in runs]}
    write_result(settings.result, result)
    return result


if __name__ == "__main__":
    main()
