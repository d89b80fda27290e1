"""Evaluation (accuracy, pass@k), the metrics log and the run summary.

``metrics.jsonl`` holds one JSON record per logged step with at least ``REQUIRED_KEYS``
(null where not measured at that step). ``summary.json`` holds at least ``SUMMARY_KEYS``.
"""

from __future__ import annotations

import json
import os
from math import comb

import numpy as np

from replaytheory.io import nonfinite_to_none

REQUIRED_KEYS = ("step", "samples_generated", "samples_consumed", "compute_units", "wall_time",
                 "train_reward", "eval_accuracy", "entropy", "staleness_mean",
                 "replay_ratio_mean", "steps_since_last_use_mean", "mu_measured")
SUMMARY_KEYS = ("warm_start_accuracy", "best_eval_accuracy", "final_eval_accuracy",
                "compute_to_98pct_best", "mu_measured", "mu_accounting", "samples_generated",
                "samples_consumed")
# Fields that depend on the clock: they differ between an interrupted-and-resumed run and an
# uninterrupted one, everything else is identical (so are compute_units and mu_accounting
# when schedule.mu_accounting is -1, i.e. taken from the measured, clock-based mu).
TIMING_KEYS = ("wall_time", "gen_seconds", "train_seconds", "mu_measured", "probe_seconds",
               "eval_seconds", "grade_seconds", "checkpoint_seconds", "time_breakdown")
EVAL_CHUNK = 256


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n - c, k) / C(n, k), k <= n."""
    if k > n:
        raise ValueError(f"pass@k needs k <= n samples, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def _rewards(sampler, tokenizer, task, problems, prompts, *, temperature, top_p, seed,
             max_new_tokens, unparseable: list | None = None) -> np.ndarray:
    """Rewards of one completion per prompt; with ``unparseable`` (a list) and a task that
    has ``parseable(text)``, appends whether each completion could not be parsed."""
    out = []
    for start in range(0, len(prompts), EVAL_CHUNK):
        part = prompts[start:start + EVAL_CHUNK]
        gen = sampler.generate(part, max_new_tokens=max_new_tokens, temperature=temperature,
                               top_p=top_p, seed=seed + start)
        for i, prob in enumerate(problems[start:start + EVAL_CHUNK]):
            text = tokenizer.decode(gen.completion(i), skip_special_tokens=True)
            out.append(task.reward(prob, text))
            if unparseable is not None and hasattr(task, "parseable"):
                unparseable.append(not task.parseable(text))
    return np.asarray(out)


def evaluate(sampler, tokenizer, task, prompts, cfg, seed: int) -> dict:
    """Held-out accuracy (greedy or ``eval.temperature``) and pass@k at the sampler's weights.

    A completion counts as correct when its reward is 1 (partial credit does not).

    prompts: token ids of ``task.eval_problems``. seed: randomness of this evaluation only.
    Returns eval_accuracy in [0, 1] and pass@k for each k in ``eval.pass_k``; for a task
    with ``parseable(text)`` (a final answer to grade), also eval_unparseable, the share in
    [0, 1] of the held-out completions without one (they score 0).
    """
    e, mx = cfg.eval, cfg.sampler.max_new_tokens
    problems = task.eval_problems
    bad: list = []
    acc = _rewards(sampler, tokenizer, task, problems, prompts, temperature=e.temperature,
                   top_p=1.0, seed=seed, max_new_tokens=mx, unparseable=bad)
    result = {"eval_accuracy": float(np.mean(acc >= 1.0))}
    if bad:
        result["eval_unparseable"] = float(np.mean(bad))
    if e.pass_k and e.pass_k_problems:
        n = max(e.pass_k)
        sub = list(range(min(e.pass_k_problems, len(problems))))
        rep_probs = [problems[i] for i in sub for _ in range(n)]
        rep_prompts = [prompts[i] for i in sub for _ in range(n)]
        r = _rewards(sampler, tokenizer, task, rep_probs, rep_prompts,
                     temperature=e.pass_k_temperature, top_p=e.pass_k_top_p, seed=seed + 7919,
                     max_new_tokens=mx).reshape(len(sub), n)
        correct = (r >= 1.0).sum(1)
        for k in e.pass_k:
            result[f"pass@{k}"] = float(np.mean([pass_at_k(n, int(c), k) for c in correct]))
    return result


class MetricsLog:
    """Append-only JSONL log that can be cut back to a checkpointed byte offset.

    Each record is written with one write and flushed, so a kill leaves at most one torn last
    line, which ``truncate`` removes on resume together with every line after the checkpoint.
    """

    def __init__(self, path: str, tensorboard_dir: str | None = None):
        self.path = path
        self.fh = open(path, "a")
        self.tb = None
        if tensorboard_dir:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ValueError("run.tensorboard=true needs the tensorboard package") from None
            self.tb = SummaryWriter(tensorboard_dir)

    @staticmethod
    def truncate(path: str, offset: int) -> None:
        """Cut ``path`` back to ``offset`` bytes (the log position saved with a checkpoint)."""
        if os.path.exists(path):
            with open(path, "r+") as fh:
                fh.truncate(offset)

    def write(self, record: dict) -> None:
        """Append one record (non-finite floats become null) and flush it."""
        self.fh.write(json.dumps(nonfinite_to_none(record)) + "\n")
        self.fh.flush()
        if self.tb is not None:
            for k, val in record.items():
                if isinstance(val, (int, float)) and not isinstance(val, bool) and k != "step":
                    self.tb.add_scalar(k, val, record["step"])

    def position(self) -> int:
        """Byte offset after the last complete record, made durable."""
        self.fh.flush()
        os.fsync(self.fh.fileno())
        return self.fh.tell()

    def close(self) -> None:
        """Close the log (and the TensorBoard writer)."""
        self.fh.close()
        if self.tb is not None:
            self.tb.close()


def read_jsonl(path: str) -> list[dict]:
    """Records of a JSONL file."""
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def summarize(records: list[dict], extra: dict) -> dict:
    """summary.json content from the metrics records (and ``extra`` fields, e.g. histograms).

    compute_to_98pct_best: compute units at the first evaluation reaching 98% of the best
    accuracy (null if compute was not accounted).
    """
    evals = [r for r in records if r.get("eval_accuracy") is not None]
    best = max((r["eval_accuracy"] for r in evals), default=None)
    first = next((r for r in evals if best is not None and r["eval_accuracy"] >= 0.98 * best),
                 None)
    last = records[-1] if records else {}
    return {
        "warm_start_accuracy": evals[0]["eval_accuracy"] if evals else None,
        "best_eval_accuracy": best,
        "final_eval_accuracy": evals[-1]["eval_accuracy"] if evals else None,
        "compute_to_98pct_best": first.get("compute_units") if first else None,
        "step_to_98pct_best": first.get("step") if first else None,
        "samples_generated": last.get("samples_generated"),
        "samples_consumed": last.get("samples_consumed"),
        "final_metrics": last,
        **extra,
    }
