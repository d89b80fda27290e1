"""Overlap, so that the saving reaches the clock (issue 37, part 2): sampler and trainer side
by side against the serial schedule, on cpu_long at each ``sampler.max_concurrent`` level.
The overlapped arms (``--arms``): ``schedule.engine=overlap`` with the sampler in a thread
or a child process, and the Ray engine with its driver in the per-step loop
(``schedule.ray_loop=driver``) or out of it (``actors``).

Per level (``--levels``; 0 = all rows at once, 8 = a KV-cache limit that makes mu ~8):

1. the balancing replay ratio: a short serial on-policy run (``--mu-steps`` updates) gives
   the sampler side's seconds (generate + grade) for B rollouts over the update's; that
   ratio is the first guess of the replay ratio y at which the sides take equal time per
   step, refined by up to ``--balance-rounds`` short sync runs (decoding fewer rows is not
   proportionally cheaper at full width); y in [1, B/G]. ``--replay-ratio`` fixes it;
2. ``--repeats`` rounds at that y: the serial sync run (``schedule.engine=emulated``), then
   each arm, ``--steps`` updates each, evaluation only at the ends (outside the measured
   window). The in-process arms and the Ray actors' loop run the serial schedule's quotas
   (sync at y). The Ray driver's loop runs mode async only (W = T = 1): its samplers make
   what they can, so its replay ratio comes from the clock (``replay_ratio_effective``).

Measured in the steady window, from the record of step ``SKIP`` to that of the last step:

* updates/s of each run;
* each side's rate measured alone, from the serial run (one core, the sides in turn): the
  sampler side's steps/s (1 / its generate + grade seconds per step) and the trainer's
  (1 / update seconds per step). The slower of the two bounds any overlap at y;
* overlap efficiency = overlapped updates/s / the slower side's rate alone (goal >= 0.9
  in process, >= 0.8 on Ray; for the Ray driver's loop read it with its effective replay
  ratio: above y, its trainer does not wait for the sampler and the ratio can pass 1);
* speed-up = overlapped updates/s / serial updates/s (goal >= 1.4 at the balancing y; the
  ideal at perfect balance is 2);
* contention: the sampler's busy seconds per rollout made and the trainer's per update, in
  the overlapped run over the serial run's (> 1: the side slowed down beside the other, e.g.
  on the GIL, memory bandwidth or a busy machine).

The result also keeps each in-process run's whole ``time_breakdown`` (serial on-policy from
the balancing run, serial sync and overlapped from each round), for the bars per schedule.

Run: ``python -m benchmarks.overlap --out benchmarks/results/overlap.json`` (levels 0 and 8,
16 steps, 2 repeats). ``--quick``: one level, a batch of 16 and a few steps (a smoke test,
not a measurement).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS, print_table, set_threads, write_result

REPO = Path(__file__).resolve().parent.parent
# The committed cpu_long warm start (timing does not depend on the policy; training one takes
# ~10 minutes): docs/experiments/cpu_long.md.
WARM_START = [f"model.warm_start_path={REPO / 'results' / 'cpu_long' / 'warm_start'}",
              "model.warm_start_sha256="
              "4c8d5e457f012c482687c1eb4ec83f4518c63594b15dbd77710871a96696a8a6"]
# The first logged steps left out of the measured window (start-up, the first evaluation).
SKIP = 2
# Held-out problems per evaluation: the evaluations (at the first step and the end) lie
# outside the measured window, and at a KV-cache limit of 8 cpu_long's 200 take ~30 s each.
EVAL_SIZE = 16
QUICK = ["schedule.batch_size=16", "schedule.group_size=4", "task.eval_size=8",
         "buffer.capacity=128"]
SIDES = {"sampler": ("generate", "grade"), "trainer": ("update",)}
# The overlapped arms: in process (the sampler in a thread or a child process), and the Ray
# engine (W = T = 1) with the actors running the loop (mode sync, the serial quotas, like the
# in-process arms) or the driver in the per-step loop (mode async only: its rate comes from
# the clock, so its effective replay ratio is reported).
ARMS = {"thread": ["schedule.engine=overlap", "schedule.overlap_sampler=thread"],
        "process": ["schedule.engine=overlap", "schedule.overlap_sampler=process"],
        "ray-actors": ["schedule.engine=ray", "schedule.ray_loop=actors"],
        "ray-driver": ["schedule.engine=ray", "schedule.mode=async",
                       "schedule.ray_loop=driver"]}
# The columns printed per run (side_ratio: the serial run's sampler seconds per step over its
# update seconds, 1 = balanced).
RUN_COLUMNS = ["max_concurrent", "arm", "replay_ratio", "replay_ratio_effective", "side_ratio",
               "serial_updates_per_s", "overlap_updates_per_s", "sampler_alone_per_s",
               "trainer_alone_per_s", "efficiency", "speedup", "ideal_speedup",
               "sampler_contention", "trainer_contention", "load_1min"]


def one_run(config: str, overrides: list[str]) -> tuple[dict, list[dict]]:
    """(summary, metrics records) of one run of ``config`` with ``overrides``."""
    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    cfg = load_config(config, overrides)
    with tempfile.TemporaryDirectory() as out:
        summary = run_experiment(cfg, os.path.join(out, "run"))
        records = read_jsonl(os.path.join(out, "run", "metrics.jsonl"))
    return summary, records


def window(records: list[dict]) -> dict:
    """Steps, seconds, rollouts made and drawn, and per-side busy seconds between the records
    of step ``SKIP`` and of the last step (the final evaluation's record is left out), and
    the run's whole time breakdown (``engines/timing.py``, from the final record: for the
    bars per schedule; on the Ray engine each side the mean over its actors)."""
    rows = sorted(records, key=lambda r: r["step"])
    whole = rows[-1].get("time_breakdown")
    rows = rows[:-1]  # the last: the final evaluation
    a, b = next(r for r in rows if r["step"] >= SKIP), rows[-1]
    out = {"steps": b["step"] - a["step"], "seconds": b["wall_time"] - a["wall_time"],
           "generated": b["samples_generated"] - a["samples_generated"],
           "consumed": b["samples_consumed"] - a["samples_consumed"], "time_breakdown": whole}
    for side, parts in SIDES.items():
        out[side] = _busy(b, side, parts) - _busy(a, side, parts)
    return out


def _busy(record: dict, side: str, parts: tuple) -> float:
    """A side's busy seconds so far in ``record``: its ``time_breakdown`` parts, or, in a
    record without one, the samplers' busy seconds and the update seconds."""
    if record.get("time_breakdown") is not None:
        return sum(record["time_breakdown"][side][k] for k in parts)
    if side == "trainer":
        return record["train_seconds"]
    return sum(v for k, v in record["busy_seconds"].items() if k.startswith("sampler"))


def side_ratio(config: str, base: list[str], steps: int, y: float | None) -> dict:
    """A short serial run (on-policy if ``y`` is None, else sync at replay ratio ``y``): its
    sampler seconds (generate + grade) per step over its update seconds per step."""
    mode = ["schedule.mode=on_policy"] if y is None else \
        ["schedule.mode=sync", f"schedule.replay_ratio={y}"]
    summary, _ = one_run(config, [*base, *mode, f"run.steps={steps}", f"eval.every={steps}",
                                  f"run.checkpoint_every={steps}"])
    tb = summary["time_breakdown"]
    return {"mu_measured": summary["mu_measured"], "time_breakdown": tb,
            "ratio": sum(tb["sampler"][k] for k in SIDES["sampler"]) / tb["trainer"]["update"]}


def balancing_ratio(config: str, base: list[str], steps: int, rounds: int,
                    most: float) -> dict:
    """The replay ratio y in [1, ``most``] at which the sides take about equal time per step:
    from a serial on-policy run, y = its sampler/update ratio; then up to ``rounds`` short
    sync runs, each scaling y by the ratio it measured (decoding a narrower batch is not
    proportionally cheaper, so one step does not suffice), stopping within 15%."""
    first = side_ratio(config, base, steps, None)
    y, trail = min(most, max(1.0, first["ratio"])), [first["ratio"]]
    for _ in range(rounds):
        r = side_ratio(config, base, steps, y)["ratio"]
        trail.append(r)
        if abs(r - 1) < 0.15 or (r < 1 and y == 1.0) or (r > 1 and y == most):
            break
        y = min(most, max(1.0, y * r))
    return {"mu_measured": first["mu_measured"], "ratios_seen": trail,
            "replay_ratio": round(y, 2), "on_policy_time_breakdown": first["time_breakdown"]}


def pair(config: str, base: list[str], y: float, steps: int, level: int,
         arms: list[str]) -> list[dict]:
    """One serial run at replay ratio ``y``, then one run per arm (``ARMS``): a row per arm,
    its rates and ratios against the serial run."""
    common = [*base, "schedule.mode=sync", f"schedule.replay_ratio={y}",
              f"run.steps={steps}", f"eval.every={steps}", f"run.checkpoint_every={steps}"]
    serial = window(one_run(config, [*common, "schedule.engine=emulated"])[1])
    serial_rate = serial["steps"] / serial["seconds"]
    alone = {side: serial["steps"] / serial[side] for side in SIDES}
    slower = min(alone.values())
    rows = []
    for arm in arms:
        ov = window(one_run(config, [*common, *ARMS[arm]])[1])
        rate = ov["steps"] / ov["seconds"]
        rows.append({
            "max_concurrent": level, "arm": arm, "replay_ratio": y,
            "replay_ratio_effective": ov["consumed"] / max(ov["generated"], 1),
            "serial_updates_per_s": serial_rate, "overlap_updates_per_s": rate,
            "sampler_alone_per_s": alone["sampler"], "trainer_alone_per_s": alone["trainer"],
            "side_ratio": alone["trainer"] / alone["sampler"],
            "efficiency": rate / slower, "speedup": rate / serial_rate,
            "ideal_speedup": slower / serial_rate,
            # per rollout made (the sampler) and per update (the trainer)
            "sampler_contention": ov["sampler"] / max(ov["generated"], 1)
            / (serial["sampler"] / serial["generated"]),
            "trainer_contention": ov["trainer"] / ov["steps"]
            / (serial["trainer"] / serial["steps"]),
            "load_1min": os.getloadavg()[0],
            "time_breakdown": {"serial": serial["time_breakdown"],
                               "overlap": ov["time_breakdown"]}})
    return rows


def most_ratio(a: argparse.Namespace, overrides: list[str]) -> float:
    """The largest replay ratio balanced to: B / G, one group a step."""
    from llm_experiments.config import load_config
    sc = load_config(a.config, overrides).schedule
    return sc.batch_size / sc.group_size


def parse(argv) -> argparse.Namespace:
    """The command line (module docstring); ``--quick`` sets the smoke-test sizes."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.overlap", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="cpu_long", help="shipped config name or YAML path")
    p.add_argument("--levels", type=int, nargs="+", default=[0, 8],
                   help="sampler.max_concurrent values (0 = all rows at once)")
    p.add_argument("--steps", type=int, default=16, help=f"updates per run (>= {SKIP + 2})")
    p.add_argument("--mu-steps", type=int, default=3,
                   help="updates of each short run that balances y (>= 2)")
    p.add_argument("--balance-rounds", type=int, default=2,
                   help="sync runs that refine the balancing y (>= 0)")
    p.add_argument("--repeats", type=int, default=2, help="pairs per level (>= 1)")
    p.add_argument("--replay-ratio", type=float, default=0.0,
                   help="fix the replay ratio (> 0) instead of balancing it; 0 = balance")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS),
                   help="overlapped arms to run (the Ray ones are left out without ray)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (>= 1)")
    p.add_argument("--quick", action="store_true", help="smoke-test sizes (not a measurement)")
    p.add_argument("--no-warm-start", action="store_true",
                   help="do not pin cpu_long's committed warm start (for other configs)")
    p.add_argument("--out", default=str(RESULTS / "overlap.json"), help="result JSON path")
    p.add_argument("--set", dest="extra", action="append", default=[],
                   metavar="SECTION.KEY=VALUE", help="extra config override (repeatable)")
    a = p.parse_args(argv)
    if any(arm.startswith("ray") for arm in a.arms) and importlib.util.find_spec("ray") is None:
        print("ray is not installed: the Ray arms are left out (pip install -e \".[ray]\")")
        a.arms = [arm for arm in a.arms if not arm.startswith("ray")]
    if a.quick:
        a.levels, a.steps, a.repeats, a.mu_steps = a.levels[:1], SKIP + 3, 1, 2
        a.balance_rounds = min(a.balance_rounds, 1)
        a.extra = QUICK + a.extra
    if a.steps < SKIP + 2 or a.mu_steps < 2 or a.repeats < 1 or a.threads < 1 \
            or min(a.levels) < 0 or a.replay_ratio < 0 or a.balance_rounds < 0:
        p.error(f"--steps must be >= {SKIP + 2}, --mu-steps >= 2, --repeats >= 1, "
                f"--threads >= 1, --levels >= 0, --replay-ratio >= 0, --balance-rounds >= 0")
    return a


def main(argv=None) -> int:
    """Measure each level (module docstring), print the runs and the medians, write JSON."""
    a = parse(argv)
    set_threads(a.threads)
    warm = [] if a.no_warm_start else WARM_START
    base = [*warm, "run.progress=false", f"run.threads={a.threads}",
            f"task.eval_size={EVAL_SIZE}", *a.extra]
    runs, levels = [], []
    for level in a.levels:
        lvl = [*base, f"sampler.max_concurrent={level}"]
        bal = {"replay_ratio": a.replay_ratio} if a.replay_ratio else \
            balancing_ratio(a.config, lvl, a.mu_steps, a.balance_rounds, most_ratio(a, lvl))
        y = bal["replay_ratio"]
        mine = [row for _ in range(a.repeats)
                for row in pair(a.config, lvl, y, a.steps, level, a.arms)]
        runs += mine
        for arm in a.arms:
            rows = [r for r in mine if r["arm"] == arm]
            med = {k: statistics.median(r[k] for r in rows) for k in
                   ("efficiency", "speedup", "ideal_speedup", "overlap_updates_per_s",
                    "serial_updates_per_s")}
            levels.append({"max_concurrent": level, "arm": arm, **bal,
                           "replay_ratio": y, **med})
    print_table(runs, RUN_COLUMNS)
    print("\nmedians per level (goals: efficiency >= 0.9 in process, >= 0.8 on Ray; speedup "
          ">= 1.4 at the balancing replay ratio)")
    print_table(levels, ["max_concurrent", "arm", "mu_measured", "replay_ratio",
                         "efficiency", "speedup", "ideal_speedup"])
    out = Path(a.out)
    write_result(out.stem, {"args": vars(a), "runs": runs, "levels": levels,
                            "quick": a.quick}, folder=out.parent)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
