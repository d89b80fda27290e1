"""The machine's float32 matmul limit and the FLOP/s the harness reaches, as a fraction of it.

Run: ``python -m benchmarks.machine_limit [--threads 1] [--steps 20]``. Prints a table and
writes ``benchmarks/results/machine_limit.json``.

* Limit: square float32 products (n = 2048) on ``--threads`` threads, with torch's default
  kernel (``torch.mm``, MKL ``sgemm``) and with oneDNN (the kernel ``llm_experiments.policy.kernels``
  routes linear layers to). The machine limit is the faster of the two.
* Harness: the cpu_tiny on-policy setting (B = 64 rollouts of G = 8, up to 6 new tokens,
  2-digit addition) for the warm-started cpu_tiny model and a ~3.2M-parameter model of the
  same family (random weights, no warm start), ``--steps`` trainer steps after 3 warm-up
  steps. Achieved FLOP/s from the run's ``ComputeClock``: generation 2P FLOPs per prompt or
  generated token over sampling seconds, training 6P per trained token over update seconds
  (P parameters; attention and padding not counted). These are model FLOPs, as in "model
  FLOPs utilisation": with ``run.direct_forward`` each distinct prompt is computed once per
  batch (G = 8 rollouts share one), so the harness executes fewer FLOPs than it is credited
  with; the ``no_sharing`` rows turn that off (executed = counted, up to padding).
* Bare model: forward + backward of a fixed 64 x 12-token batch outside the harness (what a
  training step could reach with no harness work around the model).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from benchmarks.common import DEFAULT_SIZES, SIZES, best_of, print_table, set_threads, \
    write_result

N = 2048
# The harness as configured, without prompt sharing (every token of every rollout computed:
# executed FLOPs = counted FLOPs), and as before the speed work (default kernels too).
LAYOUTS = {"default": (), "no_sharing": ("run.direct_forward=false",),
           "before": ("run.direct_forward=false", "run.fast_kernels=false")}


def matmul_flops(threads: int) -> dict:
    """Float32 FLOP/s of an N x N x N product: torch default kernel and oneDNN."""
    import torch

    from llm_experiments.policy.kernels import onednn_available
    set_threads(threads)
    a, b = torch.randn(N, N), torch.randn(N, N)
    out = {"torch_mm": 2 * N ** 3 / best_of(lambda: torch.mm(a, b), 5)}
    if onednn_available():
        bt = b.t().contiguous()  # the oneDNN op computes a @ w^T
        out["onednn"] = 2 * N ** 3 / best_of(
            lambda: torch.ops.mkldnn._linear_pointwise(a, bt, None, "none", [], ""), 5)
    return out


def harness_flops(size: str, steps: int, threads: int, cache: str, extra=()) -> dict:
    """Generation and training FLOP/s of the harness (see the module docstring); ``extra``:
    config overrides."""
    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import Experiment
    shape = [f"model.{k}={v}" for k, v in SIZES[size].items()]
    if size != "tiny":
        shape.append("model.warm_start_steps=0")
    cfg = load_config("cpu_tiny", shape + [
        "schedule.mode=on_policy", "probe.every=0", f"run.threads={threads}",
        "run.progress=false", f"run.cache_dir={cache}", *extra])
    with tempfile.TemporaryDirectory() as out:
        exp = Experiment(cfg, out)
        for _ in range(3):
            exp.advance()
        c = exp.clock
        start = (c.gen_seconds, c.gen_tokens, c.train_seconds, c.train_tokens)
        t0 = time.perf_counter()
        for _ in range(steps):
            exp.advance()
        wall = time.perf_counter() - t0
    p = c.n_params
    gen_s, gen_tok = c.gen_seconds - start[0], c.gen_tokens - start[1]
    train_s, train_tok = c.train_seconds - start[2], c.train_tokens - start[3]
    return {"params": p, "gen_flops": 2 * p * gen_tok / gen_s,
            "train_flops": 6 * p * train_tok / train_s,
            "step_flops": (2 * p * gen_tok + 6 * p * train_tok) / wall,
            "train_tokens_per_step": train_tok / steps, "gen_tokens_per_step": gen_tok / steps,
            "seconds_per_step": wall / steps, "gen_share": gen_s / wall,
            "train_share": train_s / wall}


def bare_model_flops(size: str, threads: int, onednn: bool) -> float:
    """FLOP/s (6P per token) of forward + backward of a 64 x 12 batch, no harness."""
    import torch

    from benchmarks.common import random_policy
    from llm_experiments.policy.kernels import use_onednn_linear
    set_threads(threads)
    model, _ = random_policy(size)
    model.train()
    if onednn:
        use_onednn_linear(model)
    ids = torch.randint(3, 15, (64, 12))

    def step():
        model(input_ids=ids).logits.logsumexp(-1).mean().backward()
    step()
    p = sum(q.numel() for q in model.parameters())
    return 6 * p * ids.numel() / best_of(step, 10)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads everywhere")
    parser.add_argument("--steps", type=int, default=20, help="timed harness steps per size")
    parser.add_argument("--cache", default=os.environ.get("LLM_EXPERIMENTS_CACHE", ""),
                        help="warm-start cache folder (default: the harness default)")
    parser.add_argument("--name", default="machine_limit", help="result file name")
    args = parser.parse_args(argv)
    limits = matmul_flops(args.threads)
    limit = max(limits.values())
    print(f"float32 {N}^3 matmul, {args.threads} thread(s): " +
          ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in limits.items()))
    rows = []
    for size in DEFAULT_SIZES:
        bare = {k: bare_model_flops(size, args.threads, onednn=k == "onednn") for k in limits}
        for layout, extra in LAYOUTS.items():
            try:
                h = harness_flops(size, args.steps, args.threads, args.cache, extra)
            except ValueError:  # a harness version without this setting
                continue
            rows.append({"model": size, "layout": layout, **h,
                         **{f"bare_fwd_bwd_flops_{k}": v for k, v in bare.items()},
                         "gen_fraction": h["gen_flops"] / limit,
                         "train_fraction": h["train_flops"] / limit,
                         "bare_fraction": max(bare.values()) / limit})
    shown = [{"model": r["model"], "layout": r["layout"], "params": r["params"],
              "gen GFLOP/s": r["gen_flops"] / 1e9, "train GFLOP/s": r["train_flops"] / 1e9,
              "bare fwd+bwd GFLOP/s": max(v for k, v in r.items()
                                          if k.startswith("bare_fwd_bwd")) / 1e9,
              "gen/limit": r["gen_fraction"], "train/limit": r["train_fraction"],
              "bare/limit": r["bare_fraction"], "s/step": r["seconds_per_step"]}
             for r in rows]
    print(f"fractions of the machine limit ({limit / 1e9:.0f} GFLOP/s):")
    print_table(shown, list(shown[0]))
    result = {"threads": args.threads, "matmul_n": N, "matmul_flops": limits,
              "machine_limit_flops": limit, "harness": rows, "steps": args.steps}
    write_result(args.name, result)
    return result


if __name__ == "__main__":
    main()
