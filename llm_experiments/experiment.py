"""One training run: sampler -> buffer -> trainer, with evaluation, probes and checkpoints.

The loop (``Experiment.run``), for each trainer step t:

1. evaluate every ``eval.every`` steps (weights theta_t, own random stream);
2. produce ``Production.groups_due(t)`` prompt groups with weight version ``version(t)``
   (more if the buffer cannot yet give a batch), advantages computed once, insert them;
3. probe the gradient noise every ``probe.every`` steps (own random stream, no side effect);
4. draw B rollouts, take one optimizer step on the loss (2-4: ``Experiment.advance``), log,
   checkpoint.

Sampler, buffer and trainer exchange only small messages (``WeightUpdate``, ``Rollout``), so
they could be moved to separate processes. Every random draw of the training itself comes from
one numpy generator whose state is checkpointed; evaluation and probes derive their own seeds
from (run.seed, step), so they never perturb the run, and a resumed run replays it exactly
(bitwise on CPU; only the clock-based fields in ``metrics.TIMING_KEYS`` differ).
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from tqdm import tqdm

from replaytheory.io import write_json

from . import checkpoint
from .buffer import Rollout, RolloutBuffer
from .config import Config, save_config
from .direct import supports
from .kernels import use_onednn_linear
from .metrics import REQUIRED_KEYS, MetricsLog, evaluate, read_jsonl, summarize
from .models import encode_prompt, load_policy, param_count, weights_sha256
from .probes import Prober, RunCounts, RunView
from .samplers import WeightUpdate, make_sampler
from .schedule import ComputeClock, Production, WeightStore
from .seeds import EVAL_STREAM, derived_seed
from .tasks import make_task
from .trainer import PolicyTrainer, grade_rollouts


class Experiment(PolicyTrainer):
    """Everything a run holds. Build with a validated ``Config`` and an output folder."""

    def __init__(self, cfg: Config, out_dir: str):
        self.cfg, self.out = cfg, out_dir
        torch.set_num_threads(cfg.run.threads)
        self.device = torch.device(cfg.run.device)
        self.task = make_task(cfg.task)
        self.model, self.tokenizer = load_policy(cfg, self.task)
        # The initial policy's identity: a grid's runs must share it (sweep.py, judge.py).
        self.warm_start_sha256 = weights_sha256(self.model)
        if cfg.run.fast_kernels:
            use_onednn_linear(self.model)
        self.direct = cfg.run.direct_forward and supports(self.model)
        self.sampler = make_sampler(cfg, self.model, self.tokenizer)
        sc = cfg.schedule
        self.setup_update()
        self.buffer = RolloutBuffer.for_config(cfg)
        self.mu_fixed = sc.mu_accounting if sc.mu_accounting > 0 else None
        self.production = Production(sc, self.mu_fixed)
        self.clock = ComputeClock(param_count(self.model), sc.batch_size)
        self.weights = WeightStore()
        self.rng = np.random.default_rng(cfg.run.seed)
        self.step = self.next_item = self.next_group = self.consumed = 0
        self.elapsed_before = 0.0
        self._prompt_ids: dict[int, list[int]] = {}
        self.eval_prompts = [self.encode(p) for p in self.task.eval_problems]
        probing = cfg.probe.every or cfg.probe.panel_groups
        self.prober = Prober(cfg, self._run_view()) if probing else None

    def _run_view(self) -> RunView:
        """What the prober may read of this run (``probes.RunView``)."""
        return RunView(
            model=self.model, pad_id=self.tokenizer.pad_token_id,
            eos_id=self.tokenizer.eos_token_id, device=self.device,
            loss_kwargs=self.loss_kwargs, out_dir=self.out,
            buffer_capacity=self.buffer.index.capacity,
            rollouts_per_step=lambda: self.production.rollouts_per_step,
            sample_problems=self.task.sample_train, encode=self.encode,
            make_rollouts=self.make_rollouts, current_weights=self.current_weights,
            snapshot_versions=lambda: set(self.weights.snapshots),
            snapshot=self.weights.update, buffer_versions=lambda: self.buffer.versions(),
            # Late-bound: resuming replaces self.buffer after this view is built.
            probe_groups=lambda *a: self.buffer.probe_groups(*a),
            counts=lambda: RunCounts(self.clock.generated, self.consumed, self.clock.steps,
                                     self.clock.mu_time(), self.mu_accounting()))

    # ---- messages between the parts ---------------------------------------------------------

    def encode(self, problem) -> list[int]:
        """Prompt token ids of a problem (cached per problem id)."""
        ids = self._prompt_ids.get(problem.pid)
        if ids is None:
            ids = encode_prompt(self.tokenizer, problem.prompt, self.cfg.task.chat_template)
            self._prompt_ids[problem.pid] = ids
        return ids

    def current_weights(self) -> WeightUpdate:
        """The trainer's weights as a message, version = current step."""
        return WeightUpdate(self.step, self.model.state_dict())

    def sync_sampler(self, version: int) -> None:
        """Give the sampler the weights of ``version`` (current, or a published snapshot)."""
        if self.sampler.version == version:
            return
        update = self.current_weights() if version == self.step else \
            self.weights.update(version)
        self.sampler.load_weights(update)

    def make_rollouts(self, problems, gen, version: int, first_item: int,
                      first_group: int) -> list[Rollout]:
        """Grade completions and compute advantages once, per group of G (section 6)."""
        return grade_rollouts(self.cfg, self.task, self.tokenizer, self.encode, problems, gen,
                              version, first_item, first_group)

    def produce(self, n_groups: int, version: int) -> list[Rollout]:
        """Generate ``n_groups`` groups of G rollouts with weight ``version`` (timed)."""
        if n_groups == 0:
            return []
        s, g = self.cfg.sampler, self.cfg.schedule.group_size
        problems = self.task.sample_train(n_groups, self.rng)
        prompts = [self.encode(p) for p in problems for _ in range(g)]
        seed = int(self.rng.integers(2**62))
        self.sync_sampler(version)
        t0 = time.perf_counter()
        gen = self.sampler.generate(prompts, max_new_tokens=s.max_new_tokens,
                                    temperature=s.temperature, top_p=s.top_p, seed=seed)
        self.clock.gen_seconds += time.perf_counter() - t0
        self.clock.gen_tokens += int(sum(len(p) for p in prompts) + gen.lengths.sum())
        self.clock.generated += len(prompts)
        out = self.make_rollouts(problems, gen, version, self.next_item, self.next_group)
        self.next_item += len(prompts)
        self.next_group += n_groups
        return out

    # ---- evaluation ---------------------------------------------------------------------------

    def evaluate(self) -> dict:
        """Held-out accuracy and pass@k at the current weights (own seed)."""
        self.sync_sampler(self.step)
        return evaluate(self.sampler, self.tokenizer, self.task, self.eval_prompts, self.cfg,
                        seed=derived_seed(self.cfg.run.seed, self.step, EVAL_STREAM))

    # ---- checkpoint ---------------------------------------------------------------------------

    def state_dict(self, log_position: int) -> dict:
        """Everything needed to resume after step ``self.step``."""
        return {"step": self.step, "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(), "buffer": self.buffer.state_dict(),
                "weights": self.weights.snapshots, "clock": self.clock.state_dict(),
                "counters": {"next_item": self.next_item, "next_group": self.next_group,
                             "consumed": self.consumed},
                "rng": checkpoint.rng_state(self.rng), "log_position": log_position,
                "elapsed": self.elapsed_before + time.perf_counter() - self.t_start,
                "probes": self.prober.state_dict() if self.prober else None}

    def load_state_dict(self, state: dict) -> None:
        """Restore a state saved by ``state_dict``."""
        self.step = state["step"]
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.buffer = RolloutBuffer.from_state_dict(state["buffer"])
        self.weights.snapshots = state["weights"]
        self.clock.load_state_dict(state["clock"])
        vars(self).update(state["counters"])
        checkpoint.restore_rng(state["rng"], self.rng)
        self.elapsed_before = state["elapsed"]
        if self.prober:
            self.prober.load_state_dict(state["probes"])

    # ---- the loop -----------------------------------------------------------------------------

    def mu_accounting(self) -> float | None:
        """The mu used for compute units: schedule.mu_accounting, else the measured one."""
        return self.mu_fixed if self.mu_fixed is not None else self.clock.mu_time()

    def counters(self) -> dict:
        """Running counts, compute units (units of one update C) and mu, for a log record."""
        gen = self.clock.generated
        return {"samples_generated": gen, "samples_consumed": self.consumed,
                "compute_units": self.clock.compute_units(self.mu_accounting()),
                "wall_time": self.elapsed_before + time.perf_counter() - self.t_start,
                "replay_ratio_mean": self.consumed / gen if gen else None,
                "mu_measured": self.clock.mu_time(), "mu_flops": self.clock.mu_flops(),
                "mu_accounting": self.mu_accounting(),
                "gen_seconds": self.clock.gen_seconds, "train_seconds": self.clock.train_seconds,
                "probe_seconds": self.prober.seconds if self.prober else 0.0}

    def advance(self) -> tuple[dict, list[Rollout], list[Rollout]]:
        """Trainer step t = ``self.step`` without evaluation or logging: produce, insert,
        probe, draw and update (steps 2-4 of the loop). Returns (loss statistics, the
        rollouts made, the batch trained on)."""
        t, sc = self.step, self.cfg.schedule
        if self.production.publishes(t):
            self.weights.publish(t, self.model)
        if self.prober:
            self.weights.publish(t, self.model)
        new = self.production.fill(self.buffer, t, self.produce)
        probing = self.prober is not None and self.prober.due(t)
        if probing:
            self.prober.probe(t)
        if self.prober:
            self.prober.panel_step(t)
        batch = self.buffer.sample(sc.batch_size, t, self.rng)
        self.consumed += len(batch)
        stats = self.train_step(batch, keep_grad=probing)
        if probing:
            self.prober.add_minibatch(t, stats.pop("grad"))
        self.step = t + 1
        self._prune_snapshots()
        return stats, new, batch

    def run(self, resume: bool = False) -> dict:
        """Train to ``run.steps`` (from the last checkpoint if ``resume``); returns the summary."""
        cfg = self.cfg
        ckpt_dir = os.path.join(self.out, "checkpoint")
        metrics_path = os.path.join(self.out, "metrics.jsonl")
        self.t_start = time.perf_counter()
        state = checkpoint.load(ckpt_dir) if resume else None
        if state is not None:
            self.load_state_dict(state)
        # Lines written after the checkpoint are replayed identically, so cut them off.
        MetricsLog.truncate(metrics_path, state["log_position"] if state else 0)
        log = MetricsLog(metrics_path, os.path.join(self.out, "tensorboard")
                         if cfg.run.tensorboard else None)
        bar = tqdm(total=cfg.run.steps, initial=self.step, disable=not cfg.run.progress,
                   desc="steps", dynamic_ncols=True)
        last_eval = None
        while self.step < cfg.run.steps:
            t = self.step
            record = dict.fromkeys(REQUIRED_KEYS)
            record["step"] = t
            if t % cfg.eval.every == 0:
                record.update(self.evaluate())
                last_eval = record["eval_accuracy"]
            stats, new, batch = self.advance()
            if t % cfg.run.log_every == 0 or record.get("eval_accuracy") is not None:
                record.update(stats)
                record.update(self.buffer.step_stats())
                record["train_reward"] = float(np.mean([r.reward for r in new])) if new else None
                record["batch_reward"] = float(np.mean([r.reward for r in batch]))
                record["new_rollouts"] = len(new)
                record.update(self.counters())
                log.write(record)
            bar.update(1)
            bar.set_postfix(reward=record["train_reward"], acc=last_eval, refresh=False)
            if self.step % cfg.run.checkpoint_every == 0 or self.step == cfg.run.steps:
                if self.prober:
                    self.prober.save()
                checkpoint.save(ckpt_dir, self.state_dict(log.position()))
        bar.close()
        final = dict.fromkeys(REQUIRED_KEYS)
        final["step"] = self.step
        final.update(self.evaluate())
        final.update(self.counters())
        records = read_jsonl(metrics_path)
        if not records or records[-1]["step"] != self.step:
            log.write(final)
            records.append(final)
        log.close()
        summary = summarize(records, self.summary_extra())
        write_json(os.path.join(self.out, "summary.json"), summary)
        return summary

    def _prune_snapshots(self) -> None:
        """Keep the weight versions producers or probes may still ask for."""
        keep = {v for v in self.weights.snapshots if v >= self.production.version(self.step)}
        if self.prober:
            keep |= self.prober.versions_needed(self.step)
        self.weights.keep_only(keep)

    def summary_extra(self) -> dict:
        """Summary fields beyond the metrics: mu, timing per step, probe cost, histograms."""
        c = self.clock
        extra = {k: val for k, val in self.counters().items()
                 if k in ("mu_measured", "mu_flops", "mu_accounting", "compute_units",
                          "wall_time", "probe_seconds")}
        extra.update({
            "histograms": self.buffer.index.histograms(),
            "parameters": c.n_params,
            "warm_start_sha256": self.warm_start_sha256,
            "steps": c.steps,
            "gen_seconds_per_step": c.gen_seconds / max(c.steps, 1),
            "train_seconds_per_step": c.train_seconds / max(c.steps, 1),
            "probe_fraction_of_wall_time": (self.prober.seconds / extra["wall_time"])
            if self.prober and extra["wall_time"] else 0.0,
            "rollouts_per_step": self.production.rollouts_per_step,
            "schedule": {"mode": self.cfg.schedule.mode, "latency": self.production.latency,
                         "refresh_every": self.production.refresh},
        })
        return extra


def run_experiment(cfg: Config, out_dir: str, resume: bool = False,
                   address: str | None = None) -> dict:
    """Run (or resume) one experiment into ``out_dir`` with the engine of
    ``schedule.engine``; returns the summary. ``address``: the Ray cluster of the "ray"
    engine (None = ``$RAY_ADDRESS``, else a local one).

    ``out_dir`` must not exist (or be empty) unless ``resume``; with ``resume`` it must hold
    the config.yaml of an earlier run, equal to ``cfg``.
    """
    from .config import differences, read_config
    cfg_path = os.path.join(out_dir, "config.yaml")
    if resume:
        if not os.path.exists(cfg_path):
            raise ValueError(f"--resume: {out_dir!r} holds no run to resume (no config.yaml); "
                             f"drop --resume to start a new run there")
        diff = differences(read_config(cfg_path), cfg)
        if diff:
            raise ValueError(f"--resume with a config that differs from {cfg_path} in: "
                             f"{', '.join(diff)}")
    elif os.path.exists(out_dir) and os.listdir(out_dir):
        raise ValueError(f"output folder {out_dir!r} exists and is not empty; pass --resume to "
                         f"continue it or choose another --out")
    os.makedirs(out_dir, exist_ok=True)
    save_config(cfg, cfg_path)
    if cfg.schedule.engine == "ray":
        from .engines.ray_engine import RayRun
        return RayRun(cfg, out_dir, address).run(resume=resume)
    if address is not None:
        raise ValueError("--address needs schedule.engine=ray")
    return Experiment(cfg, out_dir).run(resume=resume)
