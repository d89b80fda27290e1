"""The run loop every engine shares, and the one set of run counters (theory.md sections 1-4).

For each trainer step t (``run_loop``):

1. the engine's ``train`` hook runs step t: evaluate theta_t when ``eval.every`` divides t,
   produce rollouts and add them to the buffer, draw a batch of B, update. The emulated
   engine does these in turn in one process (``fill_and_draw``: produce -> add -> draw, the
   synchronous sequence it shares with the TRL trainer); the Ray engine's driver schedules
   chunks on sampler actors and steps on trainer actors concurrently, and only reports;
2. the counters (``RunBooks``, one implementation for the emulated engine, the Ray engine
   and ``integrations.trl``) count what was made and drawn;
3. a metrics record every ``run.log_every`` steps and at every evaluation (``step_record``);
4. a checkpoint every ``run.checkpoint_every`` steps and at the end (the ``save`` hook).

Then the final evaluation, its record and ``summary.json`` (``RunBooks.summary``).
"""

from __future__ import annotations

import os
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np
from tqdm import tqdm

from replaytheory.io import write_json

from . import checkpoint
from ..config import Config
from .metrics import REQUIRED_KEYS, MetricsLog, read_jsonl, summarize
from ..rl.schedule import ComputeClock

# Counters that also go into the summary (``RunBooks.summary``).
SUMMARY_COUNTERS = ("mu_measured", "mu_flops", "mu_accounting", "compute_units", "wall_time",
                    "probe_seconds")
# Seconds of the phases outside generation and updates that ``RunBooks.phases`` counts (the
# time breakdown of ``timing.py``): evaluations, grading completions, writing checkpoints.
PHASES = ("eval_seconds", "grade_seconds", "checkpoint_seconds")


@dataclass
class RunBooks:
    """The counters of a run (checkpointed): the clock of generation and training
    (``ComputeClock``), the next item and group ids, rollouts drawn for training
    (``consumed``), wall-clock seconds of earlier sessions (``elapsed_before``), the rewards
    of the rollouts made in the current step (``made_rewards``, reset by ``start_step``) and
    seconds per phase (``phases``: the ``PHASES``, >= 0, over every session).

    mu_fixed: schedule.mu_accounting (> 0) when set, else None (then compute is accounted
    with the measured mu, theory.md section 3).
    """

    clock: ComputeClock
    mu_fixed: float | None = None
    next_item: int = 0
    next_group: int = 0
    consumed: int = 0
    elapsed_before: float = 0.0
    t_start: float = field(default_factory=time.perf_counter)
    made_rewards: list[float] = field(default_factory=list)
    phases: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    # ---- counting -----------------------------------------------------------------------------

    def new_ids(self, n_groups: int, group_size: int) -> tuple[int, int]:
        """(first item id, first group id) of ``n_groups`` new groups of ``group_size``
        rollouts; the ids are taken."""
        first = self.next_item, self.next_group
        self.next_item += n_groups * group_size
        self.next_group += n_groups
        return first

    def count_made(self, rewards, gen_seconds: float, tokens: int) -> None:
        """Count rollouts made (their ``rewards``) in ``gen_seconds`` of generation over
        ``tokens`` prompt and completion tokens."""
        c = self.clock
        c.gen_seconds += gen_seconds
        c.gen_tokens += int(tokens)
        c.generated += len(rewards)
        self.made_rewards.extend(rewards)

    def add_phase(self, name: str, seconds: float) -> None:
        """Count ``seconds`` (>= 0) of phase ``name`` (one of ``PHASES``)."""
        self.phases[name] += seconds

    def start_step(self) -> None:
        """A trainer step begins: the rollouts it makes are counted from here."""
        self.made_rewards = []

    def train_reward(self) -> float | None:
        """Mean reward of the rollouts made in the current step (None if none)."""
        return float(np.mean(self.made_rewards)) if self.made_rewards else None

    # ---- reading ------------------------------------------------------------------------------

    def start_session(self) -> None:
        """This process's session of the run starts now (wall time counts from here)."""
        self.t_start = time.perf_counter()

    def wall_time(self) -> float:
        """Seconds of the run over every session (>= 0)."""
        return self.elapsed_before + time.perf_counter() - self.t_start

    def mu_accounting(self) -> float | None:
        """The mu used for compute units: schedule.mu_accounting, else the measured one."""
        return self.mu_fixed if self.mu_fixed is not None else self.clock.mu_time()

    def replay_ratio(self) -> float | None:
        """Rollouts drawn per rollout made so far (None before any is made)."""
        gen = self.clock.generated
        return self.consumed / gen if gen else None

    def counters(self, probe_seconds: float) -> dict:
        """Running counts, compute units (units of one update C), mu and seconds, for a log
        record; ``probe_seconds``: seconds of the gradient probes so far (>= 0)."""
        c = self.clock
        return {"samples_generated": c.generated, "samples_consumed": self.consumed,
                "compute_units": c.compute_units(self.mu_accounting()),
                "wall_time": self.wall_time(), "replay_ratio_mean": self.replay_ratio(),
                "mu_measured": c.mu_time(), "mu_flops": c.mu_flops(),
                "mu_accounting": self.mu_accounting(),
                "gen_seconds": c.gen_seconds, "train_seconds": c.train_seconds,
                "probe_seconds": probe_seconds, **self.phases}

    def summary(self, counters: dict, *, histograms: dict | None,
                rollouts_per_step: float, schedule: dict, also: tuple = (),
                fields: dict | None = None) -> dict:
        """Summary fields beyond the metrics (``metrics.summarize``'s ``extra``): the
        ``SUMMARY_COUNTERS`` and ``also`` keys of ``counters`` (``counters()``' output, with an
        engine's additions), the histograms of section 2, size, timing per step, the probes'
        share of the wall time, the rate R (rollouts per step) and the ``schedule``;
        ``fields``: an engine's own (after ``parameters``)."""
        c = self.clock
        extra = {k: v for k, v in counters.items() if k in SUMMARY_COUNTERS + tuple(also)}
        wall = extra["wall_time"]
        extra.update({"histograms": histograms, "parameters": c.n_params, **(fields or {}),
                      "steps": c.steps,
                      "gen_seconds_per_step": c.gen_seconds / max(c.steps, 1),
                      "train_seconds_per_step": c.train_seconds / max(c.steps, 1),
                      "probe_fraction_of_wall_time": counters["probe_seconds"] / wall
                      if wall else 0.0,
                      "rollouts_per_step": rollouts_per_step, "schedule": schedule})
        return extra

    # ---- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The counters as plain objects (checkpoint keys clock, counters, elapsed, phases)."""
        return {"clock": self.clock.state_dict(),
                "counters": {"next_item": self.next_item, "next_group": self.next_group,
                             "consumed": self.consumed},
                "elapsed": self.wall_time(), "phases": dict(self.phases)}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict``'s output (extra keys of a checkpoint are ignored)."""
        self.clock.load_state_dict(state["clock"])
        c = state["counters"]
        self.next_item, self.next_group, self.consumed = \
            c["next_item"], c["next_group"], c["consumed"]
        self.elapsed_before = state["elapsed"]
        self.phases.update(state.get("phases", {}))  # absent in older checkpoints


@dataclass
class Drawn:
    """One synchronous step's rollouts: those made (``new``, extra groups included) and the
    batch drawn for the update (``batch``)."""

    new: list
    batch: list


def fill_and_draw(production, buffer, step: int, produce: Callable[[int, int], list], rng,
                  books: RunBooks, before_draw: Callable[[], None] | None = None) -> Drawn:
    """Steps produce -> add -> draw of trainer step ``step`` in one process: the step's
    rollouts made by ``produce(n_groups, version)`` and added to ``buffer``
    (``schedule.Production.fill``), then ``before_draw()`` (the probes read the buffer here,
    after the rollouts a growing horizon expires at this step are gone: the draw will not
    see them either), then a batch of B drawn with ``rng`` and counted as consumed."""
    new = production.fill(buffer, step, produce)
    buffer.expire(step)
    if before_draw is not None:
        before_draw()
    batch = buffer.sample(production.batch_size, step, rng)
    books.consumed += len(batch)
    return Drawn(new=new, batch=batch)


@dataclass
class StepResult:
    """What the ``train`` hook reports of a step: the evaluation of theta_t (None when not
    due), the update's loss statistics (``stats``; averaged over trainers), the mean reward
    of the batch, and the buffer's statistics of the draw (``RolloutBuffer.step_stats``)."""

    evaluation: dict | None
    stats: dict
    batch_reward: float
    buffer: dict


class Engine(Protocol):
    """The hooks of an engine (``experiment.Experiment``, ``engines.ray_engine.RayRun``).

    cfg, out: the config and run folder. books: the run's ``RunBooks``. step: the next
    trainer step (``train`` advances it).
    """

    cfg: Config
    out: str
    books: RunBooks
    step: int

    def restore(self, state: dict) -> None:
        """Take a checkpoint's state (``--resume``)."""

    def session(self, state: dict | None) -> AbstractContextManager:
        """Whatever the steps need running (actors), from ``state`` if resuming."""

    def train(self, t: int, evaluate: bool) -> StepResult:
        """Trainer step ``t``: evaluate theta_t if ``evaluate``, produce, add, draw, update;
        counts into ``books``; ``step`` becomes t + 1."""

    def evaluate(self, t: int) -> dict:
        """Held-out accuracy and pass@k of theta_t."""

    def save(self, log_position: int) -> None:
        """Write a checkpoint after step ``step`` (``log_position``: the metrics log's)."""

    def counters(self) -> dict:
        """``books.counters`` with the engine's probe seconds (and its own additions)."""

    def summary_fields(self) -> dict:
        """``books.summary`` of the run (``metrics.summarize``'s ``extra``)."""


def step_record(t: int, result: StepResult, books: RunBooks, counters: dict) -> dict:
    """The metrics record of step ``t`` (keys ``metrics.REQUIRED_KEYS`` and more)."""
    record = dict.fromkeys(REQUIRED_KEYS)
    record["step"] = t
    record.update(result.evaluation or {})
    record.update(result.stats)
    record.update(result.buffer)
    record["train_reward"] = books.train_reward()
    record["batch_reward"] = result.batch_reward
    record["new_rollouts"] = len(books.made_rewards)
    record.update(counters)
    return record


def run_loop(engine: Engine, resume: bool = False) -> dict:
    """Train ``engine`` to ``run.steps`` (from its last checkpoint if ``resume``); writes
    metrics.jsonl and summary.json in ``engine.out`` and returns the summary."""
    cfg = engine.cfg
    metrics_path = os.path.join(engine.out, "metrics.jsonl")
    engine.books.start_session()
    state = checkpoint.load(os.path.join(engine.out, "checkpoint")) if resume else None
    if state is not None:
        engine.restore(state)
    # Lines written after the checkpoint are replayed (emulated: identically), so cut them off.
    MetricsLog.truncate(metrics_path, state["log_position"] if state else 0)
    log = MetricsLog(metrics_path, os.path.join(engine.out, "tensorboard")
                     if cfg.run.tensorboard else None)
    with engine.session(state):
        _steps(engine, log)
        final = dict.fromkeys(REQUIRED_KEYS)
        final["step"] = engine.step
        final.update(engine.evaluate(engine.step))
        final.update(engine.counters())
        extra = engine.summary_fields()
    records = read_jsonl(metrics_path)
    if not records or records[-1]["step"] != engine.step:
        log.write(final)
        records.append(final)
    log.close()
    summary = summarize(records, extra)
    write_json(os.path.join(engine.out, "summary.json"), summary)
    return summary


def _steps(engine: Engine, log: MetricsLog) -> None:
    """The steps from ``engine.step`` to ``run.steps``: train, log, checkpoint."""
    cfg, books = engine.cfg, engine.books
    bar = tqdm(total=cfg.run.steps, initial=engine.step, disable=not cfg.run.progress,
               desc="steps", dynamic_ncols=True)
    last_eval = None
    while engine.step < cfg.run.steps:
        t = engine.step
        books.start_step()
        result = engine.train(t, evaluate=t % cfg.eval.every == 0)
        reward = None
        if result.evaluation is not None:
            last_eval = result.evaluation["eval_accuracy"]
        if t % cfg.run.log_every == 0 or result.evaluation is not None:
            record = step_record(t, result, books, engine.counters())
            reward = record["train_reward"]
            log.write(record)
        bar.update(1)
        bar.set_postfix(reward=reward, acc=last_eval, refresh=False)
        if engine.step % cfg.run.checkpoint_every == 0 or engine.step == cfg.run.steps:
            engine.save(log.position())
    bar.close()
