"""Gradient probes, exact against sketched (``probe.sketch_dim``, theory.md section 8.1.1):
probe seconds and peak resident memory.

Run: ``python -m benchmarks.probe_sketch [--steps 2] [--sketch-dim 4096]``. Prints a table and
writes ``benchmarks/results/probe_sketch.json``.

Each cell is one child process (so its peak RSS, ``ru_maxrss``, is its own) running ``--steps``
steps of ``cpu_tiny`` with a probe every step and the default probe sizes, from a random
initial policy (``model.warm_start_steps=0``: probe cost does not depend on the weights), at two
model shapes: cpu_tiny's (hidden 128, 4 layers) and a larger Qwen2 shape (hidden 384, 8 layers,
6 heads, 2 KV heads, MLP 1536). Per shape: probes off (the floor), exact, and sketched.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile

from benchmarks.common import print_table, write_result

SHAPES = {
    "cpu_tiny": [],
    "qwen2_h384_l8": ["model.hidden_size=384", "model.layers=8", "model.heads=6",
                      "model.kv_heads=2", "model.intermediate_size=1536"],
}


def child(overrides: list[str]) -> dict:
    """Run cpu_tiny with ``overrides`` in a temporary folder; its probe seconds, peak RSS
    (MiB) and parameter count."""
    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import run_experiment
    with tempfile.TemporaryDirectory() as out:
        summary = run_experiment(load_config("cpu_tiny", overrides), out)
    return {"probe_seconds": summary["probe_seconds"], "params": summary["parameters"],
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def cell(shape: str, probes: str, steps: int, k: int) -> dict:
    """One child process's measurement for a model shape and probes off / exact / sketch."""
    over = [f"run.steps={steps}", "run.progress=false", "model.warm_start_steps=0",
            "eval.every=1000", f"run.checkpoint_every={steps}", *SHAPES[shape],
            f"probe.every={int(probes != 'off')}",
            f"probe.sketch_dim={k if probes == 'sketch' else 0}"]
    res = subprocess.run([sys.executable, "-m", "benchmarks.probe_sketch", "--child",
                          json.dumps(over)], capture_output=True, text=True, check=True)
    return {"shape": shape, "probes": probes, **json.loads(res.stdout.strip().splitlines()[-1])}


def main(argv=None) -> None:
    """Measure every (shape, probes) cell, print and write the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2, help="trainer steps, a probe at each")
    ap.add_argument("--sketch-dim", type=int, default=4096, help="k of the sketched cells")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    rows = [cell(shape, probes, args.steps, args.sketch_dim)
            for shape in SHAPES for probes in ("off", "exact", "sketch")]
    print_table(rows, ["shape", "params", "probes", "probe_seconds", "peak_rss_mib"])
    write_result("probe_sketch", {"steps": args.steps, "sketch_dim": args.sketch_dim,
                                  "rows": rows})


if __name__ == "__main__":
    main()
