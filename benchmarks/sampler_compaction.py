"""Sampler throughput with and without compaction of finished rows (``sampler.compact_below``).

Run: ``python -m benchmarks.sampler_compaction [--threads 1] [--repeats 3]``. Prints a table
and writes ``benchmarks/results/sampler_compaction.json`` (``--name`` to change).

Workload: the addition prompts of ``benchmarks.samplers`` for the cpu_tiny and ~3.2M model
shapes (random weights), batch 256, 64 new tokens, temperature 1. The uniforms are chosen so
that half the rows end early: token 0 serves as end-of-sequence, u = 0 draws it (inverse CDF
picks the first token of positive mass) and u in [0.5, 1) never does while its probability
is below 0.5 (checked: the run fails otherwise). Rows 0, 2, 4, ... draw u = 0 at token
``new // 8``, the others run to the end. Every contender makes the same tokens (checked), so
tokens/s = generated tokens (sum of lengths) / seconds, best of ``--repeats`` timed calls
after one warm-up call, contenders interleaved.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import DEFAULT_SIZES, SIZES, best_of, print_table, random_policy, \
    set_threads, write_result
from benchmarks.samplers import addition_prompts

THRESHOLDS = (0.0, 0.5, 1.0)  # compact_below: never, under half live, at every check


def half_early_uniforms(batch: int, new: int, seed: int = 0) -> np.ndarray:
    """(batch, new) uniforms: u in [0.5, 1) everywhere but u = 0 at token ``new // 8`` of
    the even rows (which then draw token 0, the benchmark's end-of-sequence)."""
    u = 0.5 + 0.5 * np.random.default_rng(seed).random((batch, new))
    u[::2, new // 8] = 0.0
    return u


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per cell")
    parser.add_argument("--sizes", nargs="+", default=list(DEFAULT_SIZES), choices=list(SIZES))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--name", default="sampler_compaction", help="result file name")
    args = parser.parse_args(argv)
    from llm_experiments.policy.kernels import use_onednn_linear
    from llm_experiments.samplers.hf import HFSampler
    set_threads(args.threads)
    batch, new = args.batch, args.new_tokens
    uniforms = half_early_uniforms(batch, new)
    rows = []
    for size in args.sizes:
        model, tok = random_policy(size)
        use_onednn_linear(model)
        prompts = addition_prompts(tok, batch)
        samplers = {b: HFSampler(model, eos_id=0, pad_id=tok.pad_token_id, compact_below=b)
                    for b in THRESHOLDS}
        gens = {b: s.generate(prompts, max_new_tokens=new, temperature=1.0, uniforms=uniforms)
                for b, s in samplers.items()}
        lengths = gens[0.0].lengths
        want = np.where(np.arange(batch) % 2 == 0, new // 8 + 1, new)
        if not np.array_equal(lengths, want):
            raise RuntimeError(f"rows did not end as designed: lengths {lengths.tolist()}")
        for b, gen in gens.items():
            if not np.array_equal(gen.tokens, gens[0.0].tokens):
                raise RuntimeError(f"compact_below={b} changed the samples")
        seconds = {b: [] for b in THRESHOLDS}
        for rep in range(args.repeats + 1):  # the first round warms up
            for b, s in samplers.items():
                t = best_of(lambda: s.generate(prompts, max_new_tokens=new, temperature=1.0,
                                               uniforms=uniforms), 1)
                if rep:
                    seconds[b].append(t)
        row = {"model": size, "batch": batch, "new_tokens": new,
               "generated": int(lengths.sum())}
        row.update({f"compact_{b:g}": row["generated"] / min(t) for b, t in seconds.items()})
        row.update({f"compact_{b:g}/none": row[f"compact_{b:g}"] / row["compact_0"]
                    for b in THRESHOLDS[1:]})
        rows.append(row)
    print(f"\ngenerated tokens/s, best of {args.repeats}; half the rows end at token "
          f"{new // 8 + 1} of {new}")
    print_table(rows, list(rows[0]))
    result = {"tokens_per_s": rows, "threads": args.threads, "repeats": args.repeats,
              "sizes": {s: SIZES[s] for s in args.sizes}}
    write_result(args.name, result)
    return result


if __name__ == "__main__":
    main()
