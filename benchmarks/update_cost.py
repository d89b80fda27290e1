"""What an update drawn from a long buffer costs against an on-policy one, and where it goes
(issue 27 item 1).

An on-policy batch of B = 64 rollouts holds 8 prompts with G = 8 completions each; a batch
drawn rollout by rollout from a buffer of horizon x holds up to 64 distinct prompts. Here the
same real rollouts (cpu_tiny from the committed warm start ``results/heldout_init/warm_start``,
64 groups of 8 generated once) are composed into batches of B = 64 with D = 8, 16, 32, 64
distinct prompts (64 / D rollouts of each of D random groups, new groups every repeat), and
one real update (``PolicyTrainer.train_step``: forward, backward, AdamW) is timed per
(layout, D), all interleaved in one process (the order rotates every repeat; torch threads
set explicitly), so the ratios compare like with like on a loaded machine.

Layouts (``run.train_layout``): "shared_prompts" (before: each distinct prompt once),
"auto" (after: ``losses.choose_layout``), and "sequences" (each row in one pass, for the
rule's calibration). The ratio of a cell is its median update time over the on-policy
(D = 8) median of the same layout; per repeat, the paired ratio (same repeat) gives the
spread. Parts, timed inside the real update by wrapping the functions it calls: collation,
forward (``batch_logprobs`` + loss; the prompt segment's share of the shared layout as
``prompt_encoding``), backward, optimizer (clip + AdamW step), loss statistics. Beside them,
``buffer.sample`` at horizons x = 4 / 16 / 64 / 256 (y = 1) with the distinct prompts its
batches hold, and the on-policy queue's.

Run: ``python -m benchmarks.update_cost [--repeats 15] [--threads 1] [--config cpu_tiny]``;
writes ``benchmarks/results/update_cost.json``. ``--config cpu_long --cache
~/.cache/llm_experiments --name update_cost_long``: the same at issue 37's long completions
(its cached warm start).

With ``--draws``: how the batch is drawn instead (``buffer.sampling``). Buffers of horizon
x = 4 / 16 / 64 (y = 1: x B rollouts, x B / G distinct real groups, 512 generated once) are
drawn from rollout by rollout (``with_replacement``) and by whole groups
(``groups_with_replacement``, theory.md section 11.9), and one real update of each draw is
timed against an on-policy batch (8 fresh groups), per layout ("shared_prompts", the
default, and "auto"), all interleaved (order rotating every repeat): median seconds, ratio to
the same layout's on-policy median, paired ratios' spread, distinct prompts per batch.
Writes ``benchmarks/results/update_cost_draws.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from contextlib import contextmanager

import numpy as np

from benchmarks.common import print_table, set_threads, spread, write_result

WARM_START = "results/heldout_init/warm_start"
DISTINCT = (8, 16, 32, 64)
LAYOUTS = ("shared_prompts", "auto", "sequences")
HORIZONS = (4, 16, 64, 256)
PARTS = ("collate", "forward", "prompt_encoding", "backward", "optimizer", "stats")
# --draws: how a batch is drawn (replaytheory.buffer.SAMPLING_MODES), at y = 1.
DRAWS = {"rollouts": "with_replacement", "groups": "groups_with_replacement"}
DRAW_HORIZONS = (4, 16, 64)
DRAW_LAYOUTS = ("shared_prompts", "auto")


def compose(groups: list, distinct: int, rng: np.random.Generator) -> list:
    """A batch of B = len(groups[0]) * 8 rollouts: ``distinct`` random groups, B / distinct
    rollouts of each."""
    per = len(groups[0]) * 8 // distinct
    pick = rng.choice(len(groups), size=distinct, replace=False)
    return [r for g in pick for r in groups[g][:per]]


class PartTimer:
    """Seconds spent in the functions an update calls, by part (``PARTS``), accumulated while
    ``timing`` is active: the module-level names ``rl/trainer.py`` calls are wrapped."""

    def __init__(self, exp):
        self.exp, self.seconds = exp, dict.fromkeys(PARTS, 0.0)
        self._batch = None

    def _wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - t0
        return timed

    @contextmanager
    def timing(self):
        import torch

        from llm_experiments.policy import direct
        # The update moved to rl/trainer.py (PolicyTrainer): wrap the names it calls there.
        from llm_experiments.rl import trainer as experiment
        from llm_experiments.rl.losses import PromptBatch
        saved = {name: getattr(experiment, name) for name in
                 ("collate_direct", "batch_logprobs", "policy_loss", "loss_stats")}
        calls = {"n": 0}
        run_layers, backward = direct.run_layers, torch.Tensor.backward
        clip, step = torch.nn.utils.clip_grad_norm_, self.exp.opt.step

        def layers(*args, **kwargs):  # the shared layout's first pass encodes the prompts
            calls["n"] += 1
            if calls["n"] == 1 and kwargs.get("keep_from", 0) == 0 and \
                    isinstance(self._batch, PromptBatch):
                return self._wrap("prompt_encoding", run_layers)(*args, **kwargs)
            return run_layers(*args, **kwargs)

        def collate_direct(*args, **kwargs):
            self._batch = self._wrap("collate", saved["collate_direct"])(*args, **kwargs)
            return self._batch
        experiment.collate_direct = collate_direct
        experiment.batch_logprobs = self._wrap("forward", saved["batch_logprobs"])
        experiment.policy_loss = self._wrap("forward", saved["policy_loss"])
        experiment.loss_stats = self._wrap("stats", saved["loss_stats"])
        direct.run_layers = layers
        torch.Tensor.backward = self._wrap("backward", backward)
        torch.nn.utils.clip_grad_norm_ = self._wrap("optimizer", clip)
        self.exp.opt.step = self._wrap("optimizer", step)
        try:
            yield self
        finally:
            vars(experiment).update(saved)
            direct.run_layers, torch.Tensor.backward = run_layers, backward
            torch.nn.utils.clip_grad_norm_ = clip
            del self.exp.opt.step


def time_updates(exp, groups, repeats: int, seed: int) -> dict:
    """(layout, D) -> per repeat {"total": seconds of one update, part: seconds}."""
    rng = np.random.default_rng(seed)
    contenders = [(layout, d) for layout in LAYOUTS for d in DISTINCT]
    out = {c: [] for c in contenders}
    for rep in range(repeats):
        batches = {d: compose(groups, d, rng) for d in DISTINCT}
        shift = rep % len(contenders)
        for layout, d in contenders[shift:] + contenders[:shift]:
            exp.cfg.run.train_layout = layout
            timer = PartTimer(exp)
            with timer.timing():
                t0 = time.perf_counter()
                exp.train_step(batches[d], keep_grad=False)
                total = time.perf_counter() - t0
            out[(layout, d)].append({"total": total, **timer.seconds})
    return out


def summarise(times: dict) -> list[dict]:
    """One row per (layout, D): update seconds (median, spread), the ratio of medians to
    the same layout's D = 8 and the spread of the per-repeat paired ratios, parts' medians."""
    rows = []
    for (layout, d), reps in times.items():
        base = times[(layout, DISTINCT[0])]
        total = [r["total"] for r in reps]
        paired = [r["total"] / b["total"] for r, b in zip(reps, base)]
        versus_before = [r["total"] / b["total"]
                         for r, b in zip(reps, times[("shared_prompts", DISTINCT[0])])]
        rows.append({"layout": layout, "distinct_prompts": d, "seconds": spread(total),
                     "ratio_to_on_policy": statistics.median(total) /
                     statistics.median(r["total"] for r in base),
                     "paired_ratio": spread(paired),
                     "ratio_to_old_on_policy": statistics.median(versus_before),
                     "parts_median": {p: statistics.median(r[p] for r in reps) for p in PARTS}})
    return rows


def buffer_costs(rollouts: list, batch: int, draws: int, seed: int) -> list[dict]:
    """``RolloutBuffer.sample`` of ``batch`` rollouts at y = 1 for each horizon x (capacity
    x * batch, filled with copies of ``rollouts`` under new item and group ids), with the
    distinct groups (prompts) a draw holds; and the on-policy queue (add B, take B)."""
    from llm_experiments.rl.buffer import RolloutBuffer
    rng = np.random.default_rng(seed)
    g = len(rollouts) // len({r.group_id for r in rollouts})
    out = []
    for x in HORIZONS:
        cap = x * batch
        buf = RolloutBuffer(cap)
        buf.add([dataclasses.replace(rollouts[i % len(rollouts)], item_id=i, group_id=i // g)
                 for i in range(cap)], 0)
        secs, distinct = [], []
        for step in range(draws):
            t0 = time.perf_counter()
            drawn = buf.sample(batch, step + 1, rng)
            secs.append(time.perf_counter() - t0)
            distinct.append(len({r.group_id for r in drawn}))
        out.append({"horizon": x, "sample_seconds": spread(secs),
                    "distinct_prompts": spread(distinct)})
    queue, secs = RolloutBuffer(batch, lifo=True), []
    for step in range(draws):
        queue.add([dataclasses.replace(r, item_id=step * batch + i)
                   for i, r in enumerate(rollouts[:batch])], step)
        t0 = time.perf_counter()
        queue.sample(batch, step, rng)
        secs.append(time.perf_counter() - t0)
    out.append({"horizon": "on-policy queue", "sample_seconds": spread(secs),
                "distinct_prompts": batch // g})
    return out


def draw_buffers(groups: list, batch: int) -> dict:
    """(draws, x) -> a ``RolloutBuffer`` of capacity x ``batch`` (y = 1) in each ``DRAWS``
    mode, full with the first x batch / G of ``groups`` (distinct real groups, renumbered)."""
    from llm_experiments.rl.buffer import RolloutBuffer
    g = len(groups[0])
    out = {}
    for x in DRAW_HORIZONS:
        held = [dataclasses.replace(r, item_id=k * g + j, group_id=k)
                for k, grp in enumerate(groups[:x * batch // g]) for j, r in enumerate(grp)]
        if len(held) < x * batch:
            raise ValueError(f"horizon {x} needs {x * batch // g} groups, got {len(groups)}")
        for draws, mode in DRAWS.items():
            out[(draws, x)] = RolloutBuffer(x * batch, sampling=mode, group_size=g)
            out[(draws, x)].add(held, 0)
    return out


def time_draws(exp, groups, buffers: dict, repeats: int, seed: int) -> dict:
    """(layout, draws, x) -> per repeat {"total": seconds of one update, "distinct":
    distinct prompts of its batch}; draws "on_policy" (x = 0) is 8 random fresh groups."""
    rng = np.random.default_rng(seed)
    batch = len(groups[0]) * 8
    contenders = [(layout, *key) for layout in DRAW_LAYOUTS
                  for key in [("on_policy", 0), *buffers]]
    out = {c: [] for c in contenders}
    for rep in range(repeats):
        shift = rep % len(contenders)
        for layout, draws, x in contenders[shift:] + contenders[:shift]:
            drawn = compose(groups, 8, rng) if draws == "on_policy" else \
                buffers[(draws, x)].sample(batch, rep + 1, rng)
            exp.cfg.run.train_layout = layout
            t0 = time.perf_counter()
            exp.train_step(drawn, keep_grad=False)
            out[(layout, draws, x)].append({"total": time.perf_counter() - t0, "distinct": len(
                {r.prompt.tobytes() for r in drawn})})
    return out


def summarise_draws(times: dict) -> list[dict]:
    """One row per (layout, draws, x): update seconds, the ratio of medians to the same
    layout's on-policy median and the spread (min / median / max, and quartiles) of the
    per-repeat paired ratios, distinct prompts per batch."""
    rows = []
    for (layout, draws, x), reps in times.items():
        base = times[(layout, "on_policy", 0)]
        total = [r["total"] for r in reps]
        paired = [r["total"] / b["total"] for r, b in zip(reps, base)]
        rows.append({"layout": layout, "draws": draws, "horizon": x, "seconds": spread(total),
                     "ratio_to_on_policy": statistics.median(total) /
                     statistics.median(r["total"] for r in base),
                     "paired_ratio": spread(paired),
                     "paired_ratio_quartiles": statistics.quantiles(paired, n=4)[::2],
                     "distinct_prompts": spread([r["distinct"] for r in reps])})
    return rows


def draws_study(exp, args) -> dict:
    """The ``--draws`` benchmark (module docstring): 512 groups generated once, buffers at
    ``DRAW_HORIZONS``, interleaved updates; the result record."""
    g, batch = exp.cfg.schedule.group_size, exp.cfg.schedule.batch_size
    need = max(DRAW_HORIZONS) * batch // g
    rollouts = [r for _ in range(need // 64) for r in exp.produce(64, 0)]
    groups = [rollouts[i:i + g] for i in range(0, len(rollouts), g)]
    buffers = draw_buffers(groups, batch)
    time_draws(exp, groups, buffers, 2, args.seed + 1)  # warm-up: allocator, oneDNN
    rows = summarise_draws(time_draws(exp, groups, buffers, args.repeats, args.seed))
    print_table([{"layout": r["layout"], "draws": r["draws"], "x": r["horizon"],
                  "median_s": r["seconds"]["median"], "ratio": r["ratio_to_on_policy"],
                  "paired_q50": r["paired_ratio"]["median"],
                  "distinct": r["distinct_prompts"]["median"]} for r in rows],
                ["layout", "draws", "x", "median_s", "ratio", "paired_q50", "distinct"])
    return {"setting": {"model": args.config, "warm_start": warm_start_of(args.config),
                        "batch_size": batch,
                        "group_size": g, "replay_ratio": 1, "repeats": args.repeats,
                        "threads": args.threads, "groups_generated": len(groups),
                        "draws": DRAWS},
            "updates": rows}


def layout_agreement(exp, groups, seed: int) -> dict:
    """Largest |difference| of the completion log-probs of one D = 64 batch between the
    shared and the sequence layout (same weights): float32 rounding only."""
    import torch

    from llm_experiments.rl.losses import batch_logprobs, collate_prompts, collate_sequences
    rollouts = compose(groups, DISTINCT[-1], np.random.default_rng(seed))
    pad = exp.tokenizer.pad_token_id
    with torch.no_grad():
        a, _ = batch_logprobs(exp.model, collate_prompts(rollouts, pad), 1.0)
        b, _ = batch_logprobs(exp.model, collate_sequences(rollouts, pad), 1.0)
    mask = collate_prompts(rollouts, pad).mask
    return {"max_abs_logprob_difference": float((a - b)[mask].abs().max())}


def warm_start_of(config: str) -> str:
    """The warm start a config's updates are timed from: cpu_tiny's committed one, else the
    config's own (cached under ``--cache``)."""
    return WARM_START if config == "cpu_tiny" else f"{config}'s cached warm start"


def setup(threads: int, cache: str, config: str = "cpu_tiny"):
    """(experiment, groups): the on-policy experiment of ``config`` (cpu_tiny: from the
    committed warm start; others, e.g. cpu_long: from their cached one) and 64 generated
    groups of G = 8 rollouts."""
    from llm_experiments.config import load_config
    from llm_experiments.engines.experiment import Experiment
    pinned = [f"model.warm_start_path={WARM_START}"] if config == "cpu_tiny" else []
    cfg = load_config(config, ["schedule.mode=on_policy", "probe.every=0",
                               f"run.threads={threads}", "run.progress=false",
                               f"run.cache_dir={cache}", "trainer.lr=5e-5", *pinned])
    exp = Experiment(cfg, tempfile.mkdtemp(prefix="update_cost_"))
    g = cfg.schedule.group_size
    rollouts = exp.produce(cfg.schedule.batch_size, 0)
    return exp, [rollouts[i:i + g] for i in range(0, len(rollouts), g)]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="updates per (layout, D)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0, help="batch composition seed")
    parser.add_argument("--cache", default=os.environ.get("LLM_EXPERIMENTS_CACHE", ".cache"),
                        help="warm-start cache folder")
    parser.add_argument("--name", default=None,
                        help="result file name (default update_cost, update_cost_draws)")
    parser.add_argument("--config", default="cpu_tiny",
                        help="config whose shape is timed (cpu_long: issue 37's long "
                             "completions; its warm start from --cache)")
    parser.add_argument("--draws", action="store_true",
                        help="time updates drawn by groups vs rollouts vs on-policy instead")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    exp, groups = setup(args.threads, args.cache, args.config)
    if args.draws:
        result = draws_study(exp, args)
        write_result(args.name or "update_cost_draws", result)
        return result
    time_updates(exp, groups, 2, args.seed + 1)  # warm-up: allocator, oneDNN primitives
    rows = summarise(time_updates(exp, groups, args.repeats, args.seed))
    print_table([{"layout": r["layout"], "D": r["distinct_prompts"],
                  "median_s": r["seconds"]["median"], "ratio": r["ratio_to_on_policy"],
                  "vs_old_onp": r["ratio_to_old_on_policy"],
                  **{p: r["parts_median"][p] for p in PARTS}} for r in rows],
                ["layout", "D", "median_s", "ratio", "vs_old_onp", *PARTS])
    flat = [r for g in groups for r in g]
    buffers = buffer_costs(flat, len(groups[0]) * 8, 200, args.seed)
    print_table([{"x": b["horizon"], "sample_ms": 1e3 * b["sample_seconds"]["median"],
                  "distinct": b["distinct_prompts"] if isinstance(b["distinct_prompts"], int)
                  else b["distinct_prompts"]["median"]} for b in buffers],
                ["x", "sample_ms", "distinct"])
    from llm_experiments.rl.losses import SEQUENCE_TOKEN_RATIO, layout_tokens
    tokens = {d: layout_tokens(compose(groups, d, np.random.default_rng(args.seed)))
              for d in DISTINCT}
    result = {"setting": {"model": args.config, "warm_start": warm_start_of(args.config),
                          "batch_size": 64,
                          "group_size": len(groups[0]), "repeats": args.repeats,
                          "threads": args.threads,
                          "auto_rule": f"sequences when its tokens <= {SEQUENCE_TOKEN_RATIO} x "
                                       "the shared layout's"},
              "updates": rows, "buffer_sample": buffers,
              "tokens_per_layout": {str(d): t for d, t in tokens.items()},
              "agreement": layout_agreement(exp, groups, args.seed)}
    write_result(args.name or "update_cost", result)
    return result


if __name__ == "__main__":
    main()
