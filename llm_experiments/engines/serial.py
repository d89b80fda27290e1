"""One training run of the emulated (serial) engine: sampler -> buffer -> trainer in one
process, with evaluation, probes and checkpoints (``experiment.run_experiment`` starts it).

``Experiment`` gives the hooks of ``engines.loop.run_loop`` (the loop every engine shares).
Its step t (``Experiment.train``):

1. evaluate every ``eval.every`` steps (weights theta_t, own random stream);
2. produce ``Production.groups_due(t)`` prompt groups with weight version ``version(t)``
   (more if the buffer cannot yet give a batch), advantages computed once, insert them;
3. probe the gradient noise every ``probe.every`` steps (own random stream, no side effect);
4. draw B rollouts, take one optimizer step on the loss (2-4: ``Experiment.advance``).

Sampler, buffer and trainer exchange only small messages (``WeightUpdate``, ``Rollout``), so
they could be moved to separate processes. Every random draw of the training itself comes from
one numpy generator whose state is checkpointed; evaluation and probes derive their own seeds
from (run.seed, step), so they never perturb the run, and a resumed run replays it exactly
(bitwise on CPU; only the clock-based fields in ``metrics.TIMING_KEYS`` differ).
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext

import numpy as np
import torch

from . import checkpoint
from ..rl.buffer import HeldRollouts, Rollout, RolloutBuffer
from ..config import Config
from ..policy.direct import supports
from .loop import PHASES, RunBooks, StepResult, fill_and_draw, run_loop
from ..policy.kernels import use_fast_linear
from .metrics import evaluate
from ..policy.models import encode_prompt, load_policy, param_count, weights_sha256
from ..probing.probes import Prober, RunCounts
from ..samplers import WeightUpdate
from ..samplers.make import make_sampler
from ..rl.schedule import ComputeClock, Production, WeightStore
from .seeds import EVAL_STREAM, derived_seed
from .timing import serial_breakdown
from ..tasks.make import make_task
from ..rl.trainer import PolicyTrainer, grade_rollouts


class Experiment(PolicyTrainer):
    """Everything a run holds, and the emulated engine's hooks of ``engines.loop.Engine``.
    Build with a validated ``Config`` and an output folder."""

    def __init__(self, cfg: Config, out_dir: str):
        self.cfg, self.out = cfg, out_dir
        torch.set_num_threads(cfg.run.threads)
        self.device = torch.device(cfg.run.device)
        self.task = make_task(cfg.task)
        self.model, self.tokenizer = load_policy(cfg, self.task)
        # The initial policy's identity: a grid's runs must share it (sweep.py, judge.py).
        self.warm_start_sha256 = weights_sha256(self.model)
        if cfg.run.fast_kernels:
            use_fast_linear(self.model)
        self.direct = cfg.run.direct_forward and supports(self.model)
        self.sampler = make_sampler(cfg, self.model, self.tokenizer)
        sc = cfg.schedule
        self.setup_update()
        self.buffer = RolloutBuffer.for_config(cfg)
        mu_fixed = sc.mu_accounting if sc.mu_accounting > 0 else None
        self.production = Production(sc, mu_fixed)
        self.books = RunBooks(ComputeClock(param_count(self.model), sc.batch_size), mu_fixed)
        self.clock = self.books.clock  # the update's costs go here (``PolicyTrainer``)
        self.weights = WeightStore()
        self.rng = np.random.default_rng(cfg.run.seed)
        self.step = 0
        self._prompt_ids: dict[int, list[int]] = {}
        self.eval_prompts = [self.encode(p) for p in self.task.eval_problems]
        probing = cfg.probe.every or cfg.probe.panel_groups or cfg.probe.align_groups
        self.prober = Prober(cfg, self) if probing else None

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
        seconds = time.perf_counter() - t0
        out = self.make_rollouts(problems, gen, version, *self.books.new_ids(n_groups, g))
        self.books.add_phase("grade_seconds", time.perf_counter() - t0 - seconds)
        self.books.count_made([r.reward for r in out], seconds,
                              sum(len(p) for p in prompts) + gen.lengths.sum())
        return out

    # ---- what the probes read (``probes.RunView``) -----------------------------------------

    @property
    def probe_dir(self) -> str:
        """The run folder (``probes.npz`` goes there)."""
        return self.out

    @property
    def buffer_capacity(self) -> int:
        """N, in rollouts."""
        return self.buffer.index.capacity

    def rollouts_per_step(self) -> float:
        """R > 0, the schedule's new rollouts per trainer step."""
        return self.production.rollouts_per_step

    def sample_problems(self, n: int, rng: np.random.Generator) -> list:
        """``n`` training problems drawn with ``rng``."""
        return self.task.sample_train(n, rng)

    def snapshot_versions(self) -> set[int]:
        """The weight versions kept as snapshots."""
        return set(self.weights.snapshots)

    def snapshot(self, version: int) -> WeightUpdate:
        """A kept version's weights."""
        return self.weights.update(version)

    def buffer_versions(self) -> np.ndarray:
        """The weight version of every rollout in the buffer."""
        return self.buffer.versions()

    def probe_groups(self, group_size: int, versions: set[int], limit: int) -> HeldRollouts:
        """``RolloutBuffer.probe_groups`` of the buffer."""
        return self.buffer.probe_groups(group_size, versions, limit)

    def run_counts(self) -> RunCounts:
        """Rollouts made and drawn, steps taken, mu measured and accounted so far."""
        return RunCounts(unique_rollouts=self.clock.generated,
                         samples_consumed=self.books.consumed, steps=self.clock.steps,
                         mu_measured=self.clock.mu_time(),
                         mu_accounting=self.books.mu_accounting())

    # ---- evaluation ---------------------------------------------------------------------------

    def evaluate(self, t: int) -> dict:
        """Held-out accuracy and pass@k of theta_t, t = the current step (own seed)."""
        t0 = time.perf_counter()
        self.sync_sampler(t)
        out = evaluate(self.sampler, self.tokenizer, self.task, self.eval_prompts, self.cfg,
                       seed=derived_seed(self.cfg.run.seed, t, EVAL_STREAM))
        self.books.add_phase("eval_seconds", time.perf_counter() - t0)
        return out

    # ---- checkpoint ---------------------------------------------------------------------------

    def state_dict(self, log_position: int) -> dict:
        """Everything needed to resume after step ``self.step``."""
        return {"step": self.step, "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(), "buffer": self.buffer.state_dict(),
                "weights": self.weights.snapshots, **self.books.state_dict(),
                "rng": checkpoint.rng_state(self.rng), "log_position": log_position,
                "probes": self.prober.state_dict() if self.prober else None}

    def restore(self, state: dict) -> None:
        """Restore a state saved by ``state_dict``."""
        self.step = state["step"]
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.buffer = RolloutBuffer.from_state_dict(state["buffer"])
        self.weights.snapshots = state["weights"]
        self.books.load_state_dict(state)
        checkpoint.restore_rng(state["rng"], self.rng)
        if self.prober:
            self.prober.load_state_dict(state["probes"])

    def save(self, log_position: int) -> None:
        """Write probes.npz (with probes) and the checkpoint after step ``self.step``."""
        t0 = time.perf_counter()
        if self.prober:
            self.prober.save()
        checkpoint.save(os.path.join(self.out, "checkpoint"), self.state_dict(log_position))
        self.books.add_phase("checkpoint_seconds", time.perf_counter() - t0)

    # ---- the step -----------------------------------------------------------------------------

    def session(self, state: dict | None):
        """Nothing to start: the emulated engine runs in this process."""
        return nullcontext()

    def counters(self) -> dict:
        """``RunBooks.counters`` with the probes' seconds and the time breakdown per side
        (``timing.serial_breakdown``: one thread, the sides take turns)."""
        c = self.books.counters(self.prober.seconds if self.prober else 0.0)
        c["time_breakdown"] = serial_breakdown(c)
        return c

    def advance(self) -> tuple[dict, list[Rollout], list[Rollout]]:
        """Trainer step t = ``self.step`` without evaluation or logging: produce, insert,
        probe, draw and update (steps 2-4 of the loop). Returns (loss statistics, the
        rollouts made, the batch trained on)."""
        t = self.step
        if self.production.publishes(t):
            self.weights.publish(t, self.model)
        if self.prober:
            self.weights.publish(t, self.model)
        probing = self.prober is not None and self.prober.due(t)

        def probe() -> None:  # after the insert, before the draw
            if probing:
                self.prober.probe(t)
            if self.prober:
                self.prober.panel_step(t)
        drawn = fill_and_draw(self.production, self.buffer, t, self.produce, self.rng,
                              self.books, probe)
        stats = self.train_step(drawn.batch, keep_grad=probing)
        if probing:
            self.prober.add_minibatch(t, stats.pop("grad"))
        if "row_logr2" in stats:  # the adaptive horizon (buffer.drop_logr2)
            over = stats.pop("row_logr2") > self.cfg.buffer.drop_logr2
            stats["dropped"] = self.buffer.drop([r.item_id for r, o in
                                                 zip(drawn.batch, over) if o])
        self.step = t + 1
        self._prune_snapshots()
        return stats, drawn.new, drawn.batch

    def train(self, t: int, evaluate: bool) -> StepResult:
        """Step t = ``self.step`` of ``engines.loop.run_loop``: evaluate theta_t if
        ``evaluate``, then ``advance``."""
        evaluation = self.evaluate(t) if evaluate else None
        stats, _, batch = self.advance()
        return StepResult(evaluation=evaluation, stats=stats,
                          batch_reward=float(np.mean([r.reward for r in batch])),
                          buffer=self.buffer.step_stats())

    def run(self, resume: bool = False) -> dict:
        """Train to ``run.steps`` (from the last checkpoint if ``resume``); returns the summary."""
        return run_loop(self, resume)

    def _prune_snapshots(self) -> None:
        """Keep the weight versions producers or probes may still ask for."""
        keep = {v for v in self.weights.snapshots if v >= self.production.version(self.step)}
        if self.prober:
            keep |= self.prober.versions_needed(self.step)
        self.weights.keep_only(keep)

    def summary_fields(self) -> dict:
        """Summary fields beyond the metrics (``RunBooks.summary``) with the warm start's
        identity (a grid's runs must share it: sweep.py, judge.py)."""
        p = self.production
        return self.books.summary(
            self.counters(), histograms=self.buffer.index.histograms(),
            rollouts_per_step=p.rollouts_per_step,
            schedule={"mode": self.cfg.schedule.mode, "latency": p.latency,
                      "refresh_every": p.refresh},
            also=("time_breakdown", *PHASES),
            fields={"warm_start_sha256": self.warm_start_sha256})
