"""Memory: peak RSS of cpu_tiny runs and replay-buffer bytes against its capacity N.

Run: ``python -m benchmarks.memory [--steps 150]``. Prints two tables and writes
``benchmarks/results/memory.json``.

* Buffer: a ``RolloutBuffer`` of capacity N filled with 2N rollouts shaped like cpu_tiny's
  (6 prompt tokens, 2-6 completion tokens with their log-probs, as the sampler hands them
  over), bytes held after the fill measured with ``tracemalloc`` (numpy data included), per
  rollout and against the raw bytes: 4 per token id, 4 per log-prob, 8 per scalar (item,
  group, problem, version, reward, advantage); ``ratio_to_raw_with_index`` also counts the
  4 scalars the replay index keeps per item (insert step, uses, last use, positive). The
  target is linear in N within ~2x raw.
* Runs: peak resident set size (``ru_maxrss`` of the child process) of
  ``python -m llm_experiments run --config cpu_tiny`` for 1 step (start-up, model, one
  evaluation: the floor) and for ``--steps`` steps at buffer capacities 512 and 4096, as
  shipped and with the speed paths off (``run.fast_kernels``, ``run.direct_forward``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import tracemalloc

import numpy as np

from benchmarks.common import print_table, write_result

SCALARS = 6  # item_id, group_id, problem_id, version, reward, advantage
INDEX_SCALARS = 4  # insert_step, uses, last_use, positive (generation step = version)


def synthetic_rollouts(n: int, start: int, rng: np.random.Generator):
    """``n`` cpu_tiny-like rollouts with ids from ``start`` (fresh arrays, as produced)."""
    from llm_experiments.rl.buffer import Rollout
    out = []
    for i in range(start, start + n):
        length = int(rng.integers(2, 7))
        out.append(Rollout(i, i // 8, int(rng.integers(10000)), i // 32,
                           rng.integers(3, 15, 6).astype(np.int32),
                           rng.integers(3, 15, length).astype(np.int32),
                           -rng.random(length).astype(np.float32), float(rng.random() < 0.3),
                           float(rng.standard_normal())))
    return out


def raw_bytes(rollouts) -> int:
    """4 bytes per token id and per log-prob, 8 per scalar."""
    return sum(4 * (len(r.prompt) + len(r.completion)) + 4 * len(r.logprobs) + 8 * SCALARS
               for r in rollouts)


def buffer_bytes(capacity: int, seed: int = 0) -> dict:
    """Bytes a buffer of ``capacity`` holds after 2 x capacity insertions (see docstring).

    Rollouts are made after tracing starts (so their arrays count) and only the buffer keeps
    them; ``capacity`` must be a multiple of 64 (one batch per insertion)."""
    from llm_experiments.rl.buffer import RolloutBuffer
    rng = np.random.default_rng(seed)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    buf = RolloutBuffer(capacity)
    raws = []
    for step in range(2 * capacity // 64):
        batch = synthetic_rollouts(64, step * 64, rng)
        raws.append(raw_bytes(batch))
        buf.add(batch, insert_step=step)
    del batch
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    raw = sum(raws[-capacity // 64:])
    assert len(buf) == capacity
    return {"capacity": capacity, "bytes": used, "bytes_per_rollout": used / capacity,
            "raw_bytes_per_rollout": raw / capacity, "ratio_to_raw": used / raw,
            "ratio_to_raw_with_index": used / (raw + 8 * INDEX_SCALARS * capacity)}


# The harness as shipped, and with the speed paths off (see ``harness_vs_trl.PLAIN``): the
# oneDNN kernels cache one primitive per matrix shape, which costs resident memory.
LAYOUTS = {"default": (), "before": ("run.fast_kernels=false", "run.direct_forward=false")}


def peak_rss(steps: int, capacity: int, cache: str, extra=()) -> float:
    """Peak RSS (MiB) of one cpu_tiny run in a child process (``extra``: overrides)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "llm_experiments", "run", "--config", "cpu_tiny",
               "--out", os.path.join(out, "run"), "--set", f"run.steps={steps}",
               "--set", f"buffer.capacity={capacity}", "--set", "run.progress=false",
               "--set", f"run.cache_dir={cache}", *(a for e in extra for a in ("--set", e))]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        if status != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({status})")
    return usage.ru_maxrss / 1024  # kilobytes on Linux


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="steps of the longer runs")
    parser.add_argument("--capacities", type=int, nargs="+",
                        default=[1024, 4096, 16384, 65536], help="buffer sizes N to fill")
    parser.add_argument("--cache", default=os.environ.get("LLM_EXPERIMENTS_CACHE", ""),
                        help="warm-start cache folder (default: the harness default)")
    parser.add_argument("--name", default="memory", help="result file name")
    args = parser.parse_args(argv)
    buffers = [buffer_bytes(n) for n in args.capacities]
    print("replay buffer after 2N insertions")
    print_table(buffers, ["capacity", "bytes", "bytes_per_rollout", "raw_bytes_per_rollout",
                          "ratio_to_raw", "ratio_to_raw_with_index"])
    runs = [{"layout": layout, "steps": steps, "capacity": capacity}
            for layout in LAYOUTS
            for steps, capacity in ((1, 512), (args.steps, 512), (args.steps, 4096))]
    for r in runs:
        r["peak_rss_mib"] = peak_rss(r["steps"], r["capacity"], args.cache, LAYOUTS[r["layout"]])
    print("\ncpu_tiny runs")
    print_table(runs, ["layout", "steps", "capacity", "peak_rss_mib"])
    slope = np.polyfit([b["capacity"] for b in buffers], [b["bytes"] for b in buffers], 1)[0]
    result = {"buffer": buffers, "buffer_bytes_per_rollout_slope": float(slope),
              "runs": runs}
    write_result(args.name, result)
    return result


if __name__ == "__main__":
    main()
