"""Our harness against TRL's ``GRPOTrainer`` on the identical CPU setting, side by side.

Run: ``python -m benchmarks.harness_vs_trl [--steps 80] [--repeats 3] [--threads 1]``
(needs the ``bench`` extra: ``pip install -c constraints.txt -e ".[llm,bench]"`` with
``torch==2.13.0`` in the constraints file). Prints a table and writes
``benchmarks/results/harness_vs_trl.json``.

Identical for all contenders: the cpu_tiny warm-started model and char tokenizer (2-digit
addition, reward 1 for the exact answer), G = 8 completions per prompt, B = 64 rollouts per
trainer step (8 prompts), at most 6 new tokens at temperature 1 (no top-p / top-k), AdamW with
lr ``--lr`` (betas 0.9 / 0.999, no weight decay, constant), gradient-norm clip 1.0, the clipped
GRPO loss (eps 0.2, token losses averaged per sequence then over sequences: TRL
``loss_type="grpo"``), no KL term, group-normalised advantages, ``--threads`` torch threads.
Known differences: TRL normalises by the unbiased group std (ours: population std); TRL takes
its old log-probs from the trainer forward pass (one update per batch, so ratio 1), ours from
the sampler.

Contenders, run in turn within each repeat in this one process (so that a busy machine slows
all alike): ours on-policy (B fresh rollouts per step), ours with a replay buffer (sync mode,
replay ratio 2, N = 512: B/2 fresh rollouts per step), ours on-policy as before the speed
work (``run.fast_kernels=false run.direct_forward=false``), TRL. Throughput is the steady state
after ``--warmup`` steps: generated samples per second of wall time, and trainer steps per
second; evaluation is outside the timed window. Learning check: mean train reward over the
first and last quarter of the steps, and held-out greedy accuracy (the harness's
``evaluate``) before and after training, for every contender.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from benchmarks.common import print_table, set_threads, spread, write_result

G, B, MAX_NEW = 8, 64, 6


# The harness as it was before the speed work: default torch kernels, the model's generic
# forward (bitwise the earlier computation).
PLAIN = ("run.fast_kernels=false", "run.direct_forward=false")


def harness_config(mode: str, steps: int, lr: float, threads: int, seed: int, cache: str,
                   extra=()):
    """The cpu_tiny config with the shared settings (evaluation at the start and end only)."""
    from llm_experiments.config import load_config
    return load_config("cpu_tiny", [*extra,
        f"schedule.mode={mode}", f"schedule.batch_size={B}", f"schedule.group_size={G}",
        "schedule.replay_ratio=2", "buffer.capacity=512", f"sampler.max_new_tokens={MAX_NEW}",
        f"trainer.lr={lr}", f"run.steps={steps}", f"run.threads={threads}", f"run.seed={seed}",
        f"eval.every={steps}", "eval.pass_k_problems=0", "task.eval_size=500", "probe.every=0",
        f"run.checkpoint_every={steps}", "run.progress=false", f"run.cache_dir={cache}"])


def steady_rate(times, counts, warmup: int) -> tuple[float, float]:
    """(items per second, steps per second) between the end of step ``warmup - 1`` and the
    last step; ``times`` and ``counts`` are per-step cumulative wall time and item count."""
    dt = times[-1] - times[warmup - 1]
    return (counts[-1] - counts[warmup - 1]) / dt, (len(times) - warmup) / dt


def quarters(rewards) -> tuple[float, float]:
    """Mean reward of the first and of the last quarter of the steps."""
    q = max(1, len(rewards) // 4)
    return float(np.mean(rewards[:q])), float(np.mean(rewards[-q:]))


def run_ours(mode: str, args, seed: int, extra=()) -> dict:
    """One harness run; throughput read from its own per-step metrics log."""
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    cfg = harness_config(mode, args.steps, args.lr, args.threads, seed, args.cache, extra)
    with tempfile.TemporaryDirectory() as out:
        summary = run_experiment(cfg, os.path.join(out, "run"))
        recs = [r for r in read_jsonl(os.path.join(out, "run", "metrics.jsonl"))
                if r["step"] < args.steps]
    gen_rate, steps_rate = steady_rate([r["wall_time"] for r in recs],
                                       [r["samples_generated"] for r in recs], args.warmup)
    first, last = quarters([r["train_reward"] for r in recs if r["train_reward"] is not None])
    return {"samples_per_s": gen_rate, "steps_per_s": steps_rate,
            "trained_samples_per_s": steps_rate * B, "reward_first_quarter": first,
            "reward_last_quarter": last, "eval_before": summary["warm_start_accuracy"],
            "eval_after": summary["final_eval_accuracy"]}


def run_trl(args, seed: int) -> dict:
    """One TRL ``GRPOTrainer`` run from the same warm-started model."""
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from llm_experiments.engines.metrics import evaluate
    from llm_experiments.policy.models import encode_prompt, load_policy
    from llm_experiments.samplers.hf import HFSampler
    from llm_experiments.tasks.make import make_task

    cfg = harness_config("on_policy", args.steps, args.lr, args.threads, seed, args.cache)
    task = make_task(cfg.task)
    model, tok = load_policy(cfg, task)
    problems = task.sample_train(args.steps * B // G, np.random.default_rng(seed))
    data = Dataset.from_dict({"prompt": [p.prompt for p in problems],
                              "pid": [p.pid for p in problems]})
    step_rewards: list[float] = []

    def reward(completions, pid, **_):
        r = [task.reward(task.problem(int(i)), c) for c, i in zip(completions, pid)]
        step_rewards.append(float(np.mean(r)))
        return r

    stamps: list[float] = []
    threads_seen: list[int] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, *_, **__):
            stamps.append(time.perf_counter())
            threads_seen.append(torch.get_num_threads())

    with tempfile.TemporaryDirectory() as out:
        conf = GRPOConfig(
            output_dir=out, use_cpu=True, bf16=False, fp16=False,
            gradient_checkpointing=False, per_device_train_batch_size=B, num_generations=G,
            max_completion_length=MAX_NEW, temperature=1.0, top_p=1.0, top_k=0,
            learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0,
            weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, max_grad_norm=1.0,
            beta=0.0, epsilon=0.2, loss_type="grpo", scale_rewards="group",
            num_iterations=1, max_steps=args.steps, seed=seed, save_strategy="no",
            report_to="none", disable_tqdm=True, logging_steps=10,
            dataloader_num_workers=0)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=conf,
                              train_dataset=data, processing_class=tok, callbacks=[Stamp()])
        trainer.remove_callback(PrinterCallback)  # its per-log prints are not part of the work
        set_threads(args.threads)
        trainer.train()
    if set(threads_seen) != {args.threads}:
        raise RuntimeError(f"TRL ran with {sorted(set(threads_seen))} threads, not "
                           f"{args.threads}")
    gen_rate, steps_rate = steady_rate(stamps, [B * (i + 1) for i in range(len(stamps))],
                                       args.warmup)
    sampler = HFSampler(trainer.model, tok.eos_token_id, tok.pad_token_id)
    prompts = [encode_prompt(tok, p.prompt, False) for p in task.eval_problems]
    after = evaluate(sampler, tok, task, prompts, cfg, seed=0)["eval_accuracy"]
    first, last = quarters(step_rewards)
    return {"samples_per_s": gen_rate, "steps_per_s": steps_rate,
            "trained_samples_per_s": steps_rate * B, "reward_first_quarter": first,
            "reward_last_quarter": last, "eval_before": None, "eval_after": after}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=80, help="trainer steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    parser.add_argument("--repeats", type=int, default=3, help="runs per contender")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, every contender")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate, every contender")
    parser.add_argument("--cache", default=os.environ.get("LLM_EXPERIMENTS_CACHE", ""),
                        help="warm-start cache folder (default: the harness default)")
    parser.add_argument("--name", default="harness_vs_trl", help="result file name")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    contenders = {"ours_on_policy": lambda s: run_ours("on_policy", args, s),
                  "ours_buffer_y2_N512": lambda s: run_ours("sync", args, s),
                  "ours_on_policy_before": lambda s: run_ours("on_policy", args, s, PLAIN),
                  "trl_grpo": lambda s: run_trl(args, s)}
    runs: dict[str, list[dict]] = {k: [] for k in contenders}
    for rep in range(args.repeats):
        for name, fn in contenders.items():
            runs[name].append(fn(rep))
            print(f"repeat {rep} {name}: {runs[name][-1]['samples_per_s']:.0f} samples/s",
                  flush=True)
    # Ratios pair the runs of one repeat (measured back to back under the same load).
    ratios = [o["samples_per_s"] / t["samples_per_s"]
              for o, t in zip(runs["ours_on_policy"], runs["trl_grpo"])]
    step_ratios = [o["steps_per_s"] / t["steps_per_s"]
                   for o, t in zip(runs["ours_buffer_y2_N512"], runs["trl_grpo"])]
    before = [o["samples_per_s"] / t["samples_per_s"]
              for o, t in zip(runs["ours_on_policy_before"], runs["trl_grpo"])]
    rows = []
    for name, rs in runs.items():
        med = {k: statistics.median([r[k] for r in rs]) for k in rs[0] if rs[0][k] is not None}
        rows.append({"contender": name, **med})
    print_table(rows, ["contender", "samples_per_s", "steps_per_s", "reward_first_quarter",
                       "reward_last_quarter", "eval_before", "eval_after"])
    r = spread(ratios)
    b = spread(before)
    print(f"on-policy samples/s ours/TRL: min {r['min']:.2f}  median {r['median']:.2f}  "
          f"max {r['max']:.2f}  (before the speed work: median {b['median']:.2f})")
    result = {
        "ratio_median": r["median"], "ratio_min": r["min"], "ratio_max": r["max"],
        "ours_samples_per_s": statistics.median(x["samples_per_s"]
                                                for x in runs["ours_on_policy"]),
        "trl_samples_per_s": statistics.median(x["samples_per_s"] for x in runs["trl_grpo"]),
        "buffer_vs_trl_steps_per_s_ratio": spread(step_ratios),
        "before_ratio": b, "before_settings": list(PLAIN),
        "settings": {"model": "cpu_tiny (warm-started)", "task": "addition, 2 digits",
                     "group_size": G, "batch_size": B, "max_new_tokens": MAX_NEW,
                     "temperature": 1.0, "lr": args.lr, "steps": args.steps,
                     "warmup_steps": args.warmup, "repeats": args.repeats,
                     "threads": args.threads, "loss": "grpo clip 0.2, no KL",
                     "buffer": "sync, replay ratio 2, capacity 512"},
        "runs": runs,
    }
    write_result(args.name, result)
    return result


if __name__ == "__main__":
    main()
