"""GPU benchmark (issue 28, item 6): sampler tokens/s (ours and ``generate``), update seconds
and share of bf16 peak, peak memory against ``memory.predict_update_memory``, and a
``cpu_tiny`` run on the device.

Run: ``python -m benchmarks.gpu --force`` on a CUDA machine (about 5 minutes on one H200;
replaces ``benchmarks/results/gpu.json``), or ``python -m benchmarks.gpu --dry-run --out FILE``
on CPU: the same code paths at tiny shapes in seconds (what the tests run). ``--out`` is a
file, checked before any work: a folder is refused, and an existing file too unless
``--force``.

Workload: random-init Qwen2-shape models in bfloat16 (speed does not depend on the weights;
the addition char vocabulary), 2-digit addition prompts, B = 256 rows, 128 and 1,024 new
tokens (end-of-sequence never stops a row), temperature 1; ``generate`` at 1,024 tokens runs
64 rows (its 256-row run alone would take minutes). The update: one float32-master,
bf16-autocast Adam step on B rollouts of prompt + 128 tokens after one warm-up step, timed
with a device synchronize; share of peak = 6 P tokens / seconds / ``BF16_PEAK``.
"""

from __future__ import annotations

import os
import time

import numpy as np

from benchmarks.common import print_table, set_threads

# Dense bf16 tensor-core peak of one H200 (SXM), FLOP/s (NVIDIA's datasheet, no sparsity).
BF16_PEAK = 989e12
SHAPES = {
    "0.3b": {"hidden_size": 1024, "layers": 24, "heads": 16, "kv_heads": 2,
             "intermediate_size": 2816},
    "0.74b": {"hidden_size": 2048, "layers": 16, "heads": 16, "kv_heads": 8,
              "intermediate_size": 5504},
}
DRY = {"tiny": {"hidden_size": 32, "layers": 2, "heads": 2, "kv_heads": 1,
                "intermediate_size": 64}}


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device) -> float:
    """Wall seconds of ``fn()`` with the device's queue drained before and after."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def build(shape: dict, device, dtype: str, max_len: int):
    """(model, tokenizer, config) of a random-init model of ``shape`` in ``dtype``."""
    from llm_experiments.config import load_config
    from llm_experiments.policy.models import DTYPES, char_tokenizer, tiny_model
    from llm_experiments.tasks.arithmetic import AdditionTask
    cfg = load_config("cpu_tiny", [f"model.{k}={v}" for k, v in shape.items()]
                      + [f"model.max_len={max_len}", f"model.dtype={dtype}",
                         f"run.device={device}", "run.fast_kernels=false"])
    tok = char_tokenizer(AdditionTask(eval_size=1).alphabet())
    return tiny_model(cfg, len(tok)).to(device=device, dtype=DTYPES[dtype]).eval(), tok, cfg


def sampler_rows(name, model, tok, batch, news, device) -> list[dict]:
    """Tokens/s per new-token length (one warm-up call each, at the length: it captures the
    graphs) of ours with static-shape steps (CUDA graphs on a GPU; eager on CPU, the dry
    run), ours with the growing-slice eager step, and ``generate``."""
    from benchmarks.samplers import addition_prompts, hf_generate, ours
    contenders = {"ours": ours(model, tok, "default", graphs="on"),
                  "ours_eager": ours(model, tok, "default", graphs="off"),
                  "hf_generate": hf_generate(model, tok)}
    rows = []
    for new in news:
        tokens = {}
        for who, run in contenders.items():
            b = batch if who.startswith("ours") or new <= 128 else max(1, batch // 4)
            prompts = addition_prompts(tok, b)
            run(prompts, new if who == "ours" else 2)
            seconds = _timed(lambda: tokens.__setitem__(who, run(prompts, new)), device)
            rows.append({"model": name, "contender": who, "batch": b, "new_tokens": new,
                         "seconds": seconds, "tokens_per_s": b * new / seconds})
        # Same seed, same uniforms: the graphed steps should sample the eager steps' tokens
        # (bf16 rounding over another attention span may flip a near-tie, and a row then
        # diverges from there on).
        same = tokens["ours"].tokens == tokens["ours_eager"].tokens
        for row in rows[-3:-1]:
            row["tokens_equal_to_eager"] = float(same.mean())
    return rows


def fresh_rollouts(trainer, tok, cfg, batch, new) -> list:
    """``batch`` rollouts of up to ``new`` tokens just sampled by a ``model.dtype`` copy of
    the trainer's weights (``make_sampler``), for the precision floor of their ratios."""
    from benchmarks.samplers import addition_prompts
    from llm_experiments.rl.buffer import Rollout
    from llm_experiments.samplers.make import make_sampler
    prompts = addition_prompts(tok, batch)
    gen = make_sampler(cfg, trainer.model, tok).generate(prompts, max_new_tokens=new,
                                                          temperature=1.0, seed=0)
    return [Rollout(item_id=i, group_id=i, problem_id=i, version=0,
                    prompt=np.asarray(p, np.int32), completion=gen.completion(i).copy(),
                    logprobs=gen.logprobs[i, :gen.lengths[i]].copy(), reward=0.0,
                    advantage=1.0) for i, p in enumerate(prompts)]


def update_row(name, model, tok, cfg, batch, new, device) -> dict:
    """Seconds, share of bf16 peak and peak memory (measured on CUDA, and predicted) of one
    update of ``batch`` rollouts of ``new`` completion tokens; the mean and largest
    |log ratio| of fresh rollouts (the bf16 sampler's precision floor,
    ``PolicyTrainer.log_ratios``)."""
    import torch

    from llm_experiments.rl.buffer import Rollout
    from llm_experiments.rl.trainer import PolicyTrainer
    from llm_experiments.rl.losses import collate
    from llm_experiments.rl.memory import predict_update_memory
    from llm_experiments.policy.models import trainer_dtype
    from llm_experiments.rl.schedule import ComputeClock
    rng = np.random.default_rng(0)
    rollouts = [Rollout(item_id=i, group_id=i // 16, problem_id=i // 16, version=0,
                        prompt=rng.integers(3, len(tok), 6).astype(np.int32),
                        completion=rng.integers(3, len(tok), new).astype(np.int32),
                        logprobs=np.full(new, -2.5, np.float32), reward=float(i % 2),
                        advantage=1.0 if i % 2 else -1.0) for i in range(batch)]
    trainer = PolicyTrainer()
    trainer.cfg, trainer.tokenizer, trainer.device, trainer.direct = cfg, tok, device, True
    trainer.model = model.to(dtype=trainer_dtype(cfg))
    trainer.clock = ComputeClock(1, batch)
    trainer.setup_update()
    trainer.train_step(rollouts, keep_grad=False)  # warm-up; Adam state exists after it
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = _timed(lambda: trainer.train_step(rollouts, keep_grad=False), device)
    params = sum(p.numel() for p in model.parameters())
    tokens = batch * (6 + new)
    micro = trainer.micro_batch(collate(rollouts, tok.pad_token_id))
    predicted = predict_update_memory(trainer.shape, micro, 6 + new, compute_bytes=2,
                                      chunk=trainer.logit_chunk)
    floor = np.abs(trainer.log_ratios(fresh_rollouts(trainer, tok, cfg, batch, new)))
    return {"model": name, "params": params, "batch": batch, "new_tokens": new,
            "micro_batch": micro, "update_seconds": seconds,
            "fresh_log_ratio_abs_mean": float(floor.mean()),
            "fresh_log_ratio_abs_max": float(floor.max()),
            "bf16_peak_share": 6 * params * tokens / seconds / BF16_PEAK,
            "peak_gb_measured": torch.cuda.max_memory_allocated(device) / 1e9
            if device.type == "cuda" else None,
            "peak_gb_predicted": predicted.peak / 1e9}


def tiny_run(device: str, steps: int, out_dir: str) -> dict:
    """A ``cpu_tiny`` run of ``steps`` steps on ``device`` (its summary's key numbers)."""
    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import run_experiment
    over = [f"run.device={device}", f"run.steps={steps}", "run.progress=false"]
    if device != "cuda":  # dry run: a small shape, so its warm start takes seconds
        over += [f"model.{k}={v}" for k, v in DRY["tiny"].items()] + [
            "model.warm_start_steps=50", "model.warm_start_target=0", "task.eval_size=20",
            "eval.pass_k_problems=4", "probe.every=0"]
    t0 = time.perf_counter()
    s = run_experiment(load_config("cpu_tiny", over), out_dir)
    return {"device": device, "steps": steps, "seconds": time.perf_counter() - t0,
            "warm_start_accuracy": s["warm_start_accuracy"],
            "best_eval_accuracy": s["best_eval_accuracy"]}


def main(argv=None) -> dict:
    """Parse the command line, measure, print the tables and write the JSON."""
    import tempfile

    import torch

    from replaytheory.cli_input import Parser, output_file
    from replaytheory.io import write_json
    from benchmarks.common import RESULTS, machine
    p = Parser.from_doc("python -m benchmarks.gpu", __doc__)
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (seconds)")
    p.add_argument("--out", type=output_file, default=str(RESULTS / "gpu.json"),
                   help="result JSON file (default benchmarks/results/gpu.json)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    a = p.parse_args(argv)
    if os.path.exists(a.out) and not a.force:  # before minutes of work, not after
        p.error(f"argument --out: {a.out!r} exists; give a new file, or --force to replace it")
    dry = a.dry_run
    if not dry and not torch.cuda.is_available():
        print("error: no CUDA device; run with --dry-run on CPU")
        raise SystemExit(2)
    set_threads(1 if dry else 4)
    device = torch.device("cpu" if dry else "cuda")
    shapes, batch, news = (DRY, 8, (4, 16)) if dry else (SHAPES, 256, (128, 1024))
    samplers, updates = [], []
    for name, shape in shapes.items():
        model, tok, cfg = build(shape, device, "bfloat16", 16 + max(news))
        samplers += sampler_rows(name, model, tok, batch, news, device)
        updates.append(update_row(name, model, tok, cfg, batch, news[0], device))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory() as tmp:
        run = tiny_run(device.type, 3 if dry else 300, f"{tmp}/run")
    print_table(samplers, ["model", "contender", "batch", "new_tokens", "tokens_per_s"])
    print_table(updates, list(updates[0]))
    result = {"dry_run": dry, "samplers": samplers, "updates": updates, "cpu_tiny": run,
              "bf16_peak_flops": BF16_PEAK, "machine": machine(),
              "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"}
    write_json(a.out, result)
    print(f"wrote {a.out}")
    return result


if __name__ == "__main__":
    main()
