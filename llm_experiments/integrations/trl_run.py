"""``python -m llm_experiments trl --config NAME --out DIR [--set section.key=value ...]``:
train a harness configuration through TRL with ``ReplayGRPOTrainer``.

The harness config maps onto TRL as follows (``grpo_arguments``; theory.md sections 1-3):
schedule.batch_size B -> ``ReplaySettings.batch_size``; R = B / schedule.replay_ratio (sync)
or B (on_policy) -> GRPOConfig ``per_device_train_batch_size`` (R must be a multiple of
schedule.group_size G = ``num_generations``); buffer.capacity / sampling / delta ->
``ReplaySettings``; sampler.temperature / top_p / max_new_tokens -> ``temperature``,
``top_p`` (``top_k=0``), ``max_completion_length``; trainer.lr / beta1 / beta2 /
weight_decay / grad_clip -> AdamW (constant rate) and ``max_grad_norm``; trainer.loss grpo
with clip_low / clip_high -> ``loss_type="grpo"``, ``epsilon`` / ``epsilon_high``, beta 0;
run.steps / seed / threads / log_every -> ``max_steps``, ``seed``, torch threads,
``logging_steps``. TRL's own choices stay: advantages normalised by the unbiased group std
(the harness: population std), prompts tokenised by TRL, its sampler (``generate``).
Not mapped (refused with the key named): schedule.mode=async, buffer.lifo, losses other than
grpo, trainer.per_sample_clip, sampler.backend=vllm.

Writes ``DIR/{config.yaml, metrics.jsonl, summary.json}`` (and ``probes.npz`` with
probe.every > 0): the harness's record keys (``metrics.REQUIRED_KEYS``; evaluation every
eval.every steps with the harness's ``evaluate``) and summary (``metrics.summarize``).
``run_trl(cfg, out, plain=True)`` trains the same config with TRL's own ``GRPOTrainer``
instead (on-policy configs only), with the same records, as a baseline
(``benchmarks/trl_replay.py``).
"""

from __future__ import annotations

import functools
import json
import os
import time

import numpy as np

from replaytheory.cli_input import Parser, output_dir
from replaytheory.io import write_json

from ..config import Config, load_config, save_config
from ..engines.loop import RunBooks
from ..engines.metrics import REQUIRED_KEYS, MetricsLog, evaluate, read_jsonl, summarize
from ..policy.models import encode_prompt, load_policy, param_count
from ..samplers import WeightUpdate
from ..rl.rates import rollouts_per_step
from ..rl.schedule import ComputeClock
from ..engines.seeds import EVAL_STREAM, derived_seed
from ..tasks.make import make_task

UNSUPPORTED = {("schedule", "mode"): ("async",), ("buffer", "lifo"): (True,),
               ("sampler", "backend"): ("vllm",)}


def grpo_arguments(cfg: Config, out_dir: str):
    """(GRPOConfig keyword arguments, ``ReplaySettings``) of a harness config (see the module
    docstring). Raises ValueError naming the key that TRL cannot follow."""
    from .trl import ReplaySettings
    for (section, key), bad in UNSUPPORTED.items():
        val = getattr(getattr(cfg, section), key)
        if val in bad:
            raise ValueError(f"{section}.{key}={val} is not supported by the TRL replay trainer")
    sc, tr, s, b = cfg.schedule, cfg.trainer, cfg.sampler, cfg.buffer
    if tr.loss != "grpo":
        raise ValueError(f"trainer.loss must be grpo with the TRL replay trainer, got {tr.loss!r}")
    if tr.per_sample_clip > 0:
        raise ValueError("trainer.per_sample_clip must be 0 with the TRL replay trainer")
    if tr.optimizer != "adamw" and tr.weight_decay != 0:
        raise ValueError(f"trainer.optimizer={tr.optimizer} needs trainer.weight_decay=0 with "
                         f"TRL (AdamW without decay is Adam)")
    r = rollouts_per_step(sc)
    g = sc.group_size
    if abs(r - round(r)) > 1e-9 or round(r) % g:
        raise ValueError(f"schedule.batch_size / schedule.replay_ratio ({r:g} rollouts per step)"
                         f" must be a multiple of schedule.group_size ({g}): TRL generates "
                         f"whole groups every step")
    r = int(round(r))
    on_policy = sc.mode == "on_policy"
    replay = ReplaySettings(sc.batch_size if on_policy else b.capacity, sc.batch_size,
                            sampling=b.sampling, delta=b.delta, on_policy=on_policy,
                            seed=cfg.run.seed)
    kwargs = dict(
        output_dir=os.path.join(out_dir, "trl"), use_cpu=cfg.run.device == "cpu", bf16=False,
        fp16=False, gradient_checkpointing=False, per_device_train_batch_size=r,
        num_generations=g, steps_per_generation=1, num_iterations=1,
        gradient_accumulation_steps=1, max_completion_length=s.max_new_tokens,
        temperature=s.temperature, top_p=s.top_p, top_k=0, learning_rate=tr.lr,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=tr.weight_decay,
        adam_beta1=tr.beta1, adam_beta2=tr.beta2, max_grad_norm=tr.grad_clip, beta=0.0,
        epsilon=tr.clip_low, epsilon_high=tr.clip_high, loss_type="grpo",
        scale_rewards="group", max_steps=cfg.run.steps, seed=cfg.run.seed,
        save_strategy="no", report_to="none", disable_tqdm=not cfg.run.progress,
        logging_steps=cfg.run.log_every, dataloader_num_workers=0)
    return kwargs, replay


def _dataset(cfg: Config, task, r: int, steps_per_generation: int = 1):
    """TRL's training prompts: run.steps x R / G problems from the task's training stream
    (run.steps rounded up to whole generation batches of ``steps_per_generation`` steps),
    with their problem ids (the reward looks a problem up by id)."""
    from datasets import Dataset
    k = steps_per_generation
    n = -(-cfg.run.steps // k) * k * r // cfg.schedule.group_size
    problems = task.sample_train(n, np.random.default_rng(cfg.run.seed))
    if cfg.task.chat_template:
        prompts = [[{"role": "user", "content": p.prompt}] for p in problems]
    else:
        prompts = [p.prompt for p in problems]
    data = Dataset.from_dict({"prompt": prompts, "pid": [p.pid for p in problems]})
    return data, {p.pid: p for p in problems}


class ReplayAccounting:
    """What the records read from a ``ReplayGRPOTrainer``: its ``books`` (the harness's
    ``RunBooks``: generation and update seconds, rollouts generated and consumed), the
    probes' seconds, and the last step's draw."""

    name = "trl.ReplayGRPOTrainer"

    def __init__(self, trainer):
        self.trainer = trainer
        self.books = trainer.books

    @property
    def rollouts_per_step(self) -> int:
        return self.trainer.production.rollouts_per_step

    def probe_seconds(self) -> float:
        """Seconds of the gradient probes so far (0 without probes)."""
        prober = self.trainer.calibration.prober
        return prober.seconds if prober is not None else 0.0

    def step_stats(self) -> dict:
        """The buffer statistics, rewards and new-rollout count of the update just taken."""
        last = self.trainer.steps[-1]
        return {**last.buffer, "train_reward": self.books.train_reward(),
                "batch_reward": float(np.mean([r.reward for r in last.batch])),
                "new_rollouts": len(self.books.made_rewards)}

    def histograms(self) -> dict | None:
        """The buffer's staleness / use histograms."""
        return self.trainer.buffer.index.histograms()


class PlainAccounting:
    """The same accounting for TRL's own ``GRPOTrainer`` (``build_trainer(plain=True)``), which
    keeps no clock: a ``TrainerCallback`` (``callback``) times each optimizer step, and the
    instance's ``_generate_and_score_completions`` is wrapped by a timer that returns TRL's
    output untouched (the class and its numerics stay TRL's). Every step generates R = B
    rollouts and trains on them once, at the weights that made them (staleness 0)."""

    name = "trl.GRPOTrainer"

    def __init__(self, trainer):
        from transformers import TrainerCallback
        self.trainer = trainer
        self.rollouts_per_step = trainer.args.per_device_train_batch_size
        self.books = RunBooks(ComputeClock(param_count(trainer.model), self.rollouts_per_step))
        self._t0 = self._gen0 = 0.0
        generate = trainer._generate_and_score_completions

        def timed(inputs):
            t0 = time.perf_counter()
            out = generate(inputs)
            if trainer.model.training:
                c = self.books.clock
                c.gen_seconds += time.perf_counter() - t0
                tokens = int(out["prompt_mask"].sum() + out["completion_mask"].sum())
                c.gen_tokens += tokens
                c.train_tokens += tokens  # each rollout is trained on once
                c.generated += out["completion_ids"].size(0)
            return out
        trainer._generate_and_score_completions = timed
        acc = self

        class _Timer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                acc._t0, acc._gen0 = time.perf_counter(), acc.books.clock.gen_seconds

            def on_step_end(self, args, state, control, **kwargs):
                c = acc.books.clock
                wall = time.perf_counter() - acc._t0
                c.train_seconds += max(wall - (c.gen_seconds - acc._gen0), 0.0)
                c.steps += 1
                acc.books.consumed += acc.rollouts_per_step

        self.callback = _Timer()

    def probe_seconds(self) -> float:
        """No probes: 0."""
        return 0.0

    def step_stats(self) -> dict:
        """Rewards (TRL's logged mean of the step's generation, which is also the batch) and
        the on-policy buffer statistics of the update just taken."""
        reward = self.trainer._metrics["train"]["reward"][-1]
        return {"staleness_mean": 0.0, "first_use_fraction": 1.0, "train_reward": reward,
                "batch_reward": reward, "new_rollouts": self.rollouts_per_step}

    def histograms(self) -> None:
        """No buffer, no histograms."""
        return None


class HarnessLog:
    """The harness's metrics.jsonl records of a TRL run (a ``TrainerCallback`` built by
    ``make_harness_log``): record t holds the evaluation at the weights before update t and
    the statistics of update t; evaluation every ``eval.every`` steps and at the end.
    ``accounting``: ``ReplayAccounting`` or ``PlainAccounting`` of the trainer."""

    def __init__(self, trainer, accounting, cfg: Config, task, tokenizer, out_dir: str):
        from ..samplers.hf import HFSampler
        self.trainer, self.acc, self.cfg, self.task, self.tok = \
            trainer, accounting, cfg, task, tokenizer
        self.sampler = HFSampler(trainer.model, tokenizer.eos_token_id, tokenizer.pad_token_id,
                                 direct=cfg.run.direct_forward)
        self.prompts = [encode_prompt(tokenizer, p.prompt, cfg.task.chat_template)
                        for p in task.eval_problems]
        self.log = MetricsLog(os.path.join(out_dir, "metrics.jsonl"))
        self.pending: dict = {}
        mu = cfg.schedule.mu_accounting
        accounting.books.mu_fixed = mu if mu > 0 else None
        accounting.books.start_session()

    def evaluate(self, step: int) -> dict:
        """Held-out accuracy (and pass@k) at the trainer's current weights."""
        self.sampler.load_weights(WeightUpdate(step, self.trainer.model.state_dict()))
        return evaluate(self.sampler, self.tok, self.task, self.prompts, self.cfg,
                        seed=derived_seed(self.cfg.run.seed, step, EVAL_STREAM))

    def counters(self) -> dict:
        """Cumulative counts, compute units (one update = 1) and mu: the harness's
        ``RunBooks.counters``."""
        return self.acc.books.counters(self.acc.probe_seconds())

    def step_record(self, step: int) -> dict:
        """The record of update ``step`` (just taken)."""
        entropy = self.trainer._metrics["train"].get("entropy") or [None]
        record = dict.fromkeys(REQUIRED_KEYS)
        record.update(step=step, **self.pending, **self.acc.step_stats())
        record.update(entropy=entropy[-1], **self.counters())
        self.pending = {}
        return record

    def end_step(self, step_done: int, max_steps: int) -> None:
        """Write the record of update ``step_done``; evaluate the next step's weights when
        due (their record comes with the next update, or is the final record)."""
        if step_done % self.cfg.run.log_every == 0 or self.pending:
            self.log.write(self.step_record(step_done))
        nxt = step_done + 1
        if nxt % self.cfg.eval.every == 0 or nxt == max_steps:
            self.pending = self.evaluate(nxt)

    def finish(self, out_dir: str, steps: int) -> dict:
        """Write the final record and summary.json; returns the summary."""
        final = dict.fromkeys(REQUIRED_KEYS)
        final.update(step=steps, **(self.pending or self.evaluate(steps)), **self.counters())
        self.log.write(final)
        self.log.close()
        records = read_jsonl(os.path.join(out_dir, "metrics.jsonl"))
        extra = self.acc.books.summary(
            self.counters(), histograms=self.acc.histograms(),
            rollouts_per_step=self.acc.rollouts_per_step,
            schedule={"mode": self.cfg.schedule.mode, "engine": "trl", "latency": 0,
                      "refresh_every": 1,
                      "steps_per_generation": self.trainer.args.steps_per_generation},
            fields={"trainer": self.acc.name, "trl_version": _trl_version()})
        summary = summarize(records, extra)
        write_json(os.path.join(out_dir, "summary.json"), summary)
        return summary


def _trl_version() -> str:
    import trl
    return trl.__version__


def make_harness_log(trainer, accounting, cfg: Config, task, tokenizer, out_dir: str):
    """A ``TrainerCallback`` writing the harness's records (``HarnessLog``) of ``trainer``
    through ``accounting``. Add it after the trainer is built and after a
    ``PlainAccounting.callback``, so that it runs after the step's timing is taken
    (``CalibrationCallback`` of a ``ReplayGRPOTrainer``)."""
    from transformers import TrainerCallback

    class _Callback(TrainerCallback):
        def __init__(self):
            self.log = HarnessLog(trainer, accounting, cfg, task, tokenizer, out_dir)

        def on_train_begin(self, args, state, control, **kwargs):
            self.log.pending = self.log.evaluate(state.global_step)

        def on_step_end(self, args, state, control, **kwargs):
            self.log.end_step(state.global_step - 1, args.max_steps)

    return _Callback()


def build_trainer(cfg: Config, out_dir: str, plain: bool = False,
                  steps_per_generation: int = 1):
    """(trainer, harness-log callback) of a harness config, ready to ``train()``.

    steps_per_generation: k >= 1, the replay trainer's generation batch in steps: k R
    rollouts made in one generation every k steps (``trl.GenerationBatches``; 1: R every
    step, the mapping of the module docstring). The plain trainer needs 1.

    plain: build TRL's own ``trl.GRPOTrainer`` (the class unmodified, TRL's default handling
    of old log-probs) with the same GRPOConfig, model, prompts and reward instead of
    ``ReplayGRPOTrainer``, as the baseline of a comparison; it needs schedule.mode=on_policy
    (TRL makes B rollouts per step and uses each once) and probe.every=0 (probes need the
    replay trainer). Raises ValueError naming the key otherwise."""
    from trl import GRPOConfig, GRPOTrainer

    from ..rl.trainer import grade_rollouts
    from .trl import ProbeSource, ReplayGRPOTrainer
    import torch
    torch.set_num_threads(cfg.run.threads)
    kwargs, replay = grpo_arguments(cfg, out_dir)
    kwargs["steps_per_generation"] = steps_per_generation
    if plain:
        _check_plain(cfg, steps_per_generation)
    task = make_task(cfg.task)
    model, tok = load_policy(cfg, task)
    data, by_id = _dataset(cfg, task, kwargs["per_device_train_batch_size"],
                           steps_per_generation)

    def reward(completions, pid, **_):
        return [task.reward(by_id[int(i)], c) for c, i in zip(completions, pid)]

    if plain:
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**kwargs),
                              train_dataset=data, processing_class=tok)
        accounting = PlainAccounting(trainer)
        trainer.add_callback(accounting.callback)
        return _finish_trainer(trainer, accounting, cfg, task, tok, out_dir)
    probes = None
    if cfg.probe.every:
        tr = cfg.trainer
        encode = functools.partial(_encode, tok, cfg.task.chat_template)
        probes = ProbeSource(
            cfg, {"loss": tr.loss, "clip_low": tr.clip_low, "clip_high": tr.clip_high,
                  "is_cap": tr.is_cap, "max_new_tokens": cfg.sampler.max_new_tokens},
            task.sample_train, encode, functools.partial(grade_rollouts, cfg, task, tok, encode))
    trainer = ReplayGRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**kwargs),
                                train_dataset=data, processing_class=tok, replay=replay,
                                probes=probes, probe_dir=out_dir)
    return _finish_trainer(trainer, ReplayAccounting(trainer), cfg, task, tok, out_dir)


def _check_plain(cfg: Config, steps_per_generation: int = 1) -> None:
    """Refuse what TRL's own GRPOTrainer cannot run as the plain baseline (key named)."""
    if steps_per_generation != 1:
        raise ValueError(f"plain=True needs steps_per_generation=1 (TRL would reuse its "
                         f"generation batch across steps), got {steps_per_generation}")
    if cfg.schedule.mode != "on_policy":
        raise ValueError(f"plain=True needs schedule.mode=on_policy (TRL's GRPOTrainer uses "
                         f"each rollout once), got {cfg.schedule.mode!r}")
    if cfg.probe.every:
        raise ValueError(f"plain=True needs probe.every=0 (probes need the replay trainer), "
                         f"got {cfg.probe.every}")


def _finish_trainer(trainer, accounting, cfg: Config, task, tok, out_dir: str):
    """Route the records to metrics.jsonl (not TRL's printer); (trainer, harness-log
    callback)."""
    from transformers import PrinterCallback
    import torch
    trainer.remove_callback(PrinterCallback)
    callback = make_harness_log(trainer, accounting, cfg, task, tok, out_dir)
    trainer.add_callback(callback)
    torch.set_num_threads(cfg.run.threads)
    return trainer, callback


def _encode(tokenizer, chat: bool, problem) -> list[int]:
    return encode_prompt(tokenizer, problem.prompt, chat)


def run_trl(cfg: Config, out_dir: str, plain: bool = False,
            steps_per_generation: int = 1) -> dict:
    """Train ``cfg`` through TRL into ``out_dir`` (which must not exist or be empty);
    returns the summary. plain: TRL's own ``GRPOTrainer``; steps_per_generation: the replay
    trainer's generation batch in steps (see ``build_trainer``)."""
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise ValueError(f"output folder {out_dir!r} exists and is not empty; choose another "
                         f"--out")
    grpo_arguments(cfg, out_dir)  # refuse what TRL cannot follow before making the folder
    if plain:
        _check_plain(cfg, steps_per_generation)
    os.makedirs(out_dir, exist_ok=True)
    save_config(cfg, os.path.join(out_dir, "config.yaml"))
    trainer, callback = build_trainer(cfg, out_dir, plain=plain,
                                      steps_per_generation=steps_per_generation)
    trainer.train()
    return callback.log.finish(out_dir, trainer.state.global_step)


def main(argv=None) -> int:
    """The ``trl`` command; returns the exit status (0 ok, 2 bad input)."""
    parser = Parser(prog="python -m llm_experiments trl",
                    description="train a harness config through TRL with the replay trainer")
    parser.add_argument("--config", default="cpu_tiny",
                        help="shipped config name or YAML path (default cpu_tiny)")
    parser.add_argument("--out", type=output_dir, required=True,
                        help="output folder (must not exist yet)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE", help="override a config value (repeatable)")
    args = parser.parse_args(argv)
    try:
        summary = run_trl(load_config(args.config, args.overrides), args.out)
    except ValueError as exc:
        return parser.report(exc)
    keys = ("warm_start_accuracy", "best_eval_accuracy", "final_eval_accuracy",
            "compute_to_98pct_best", "mu_measured", "samples_generated", "samples_consumed")
    print(json.dumps({k: summary.get(k) for k in keys}, indent=1))
    return 0
