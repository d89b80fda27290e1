"""The overlapped engine (``schedule.engine=overlap``): sampler and trainer side by side, each on
its own core, so that a serial schedule's saving reaches the clock (issue 37).

The serial engine (``serial.Experiment``) makes step t's rollouts, then updates: one core at a
time. Here a sampler loop (``overlap_sampler``: a thread of this process, or a child process,
``schedule.overlap_sampler``) makes the same quotas while the trainer (this thread, the run
loop's) updates on earlier ones. Chunk s is the ``Production.groups_due(s)`` groups of mode
"on_policy" or "sync".

* trainer -> sampler: a ``ChunkOrder`` per chunk (problems, seed and item ids drawn from the
  run's own generators here), at most ``schedule.overlap_ahead`` + 1 outstanding: one in the
  making and ``overlap_ahead`` finished and waiting, a bounded FIFO handoff. New orders go
  out after each update's publish, so a chunk that starts at once has the newest weights:
  with overlap_ahead = 1, a chunk consumed first at step t was made with theta_{t-1} (lag 1)
  when either side is the slower one, and the lag grows only while a chunk waits longer;
* sampler -> trainer: ``Chunk`` messages (or a ``SamplerFailure``);
* weights: the trainer publishes every ``schedule.refresh_every`` steps into a one-slot
  channel without waiting for the sampler; the sampler takes the newest version when it
  starts a chunk, so every rollout carries the exact version that made it.

The trainer's step t: evaluate theta_t if due (the sampler keeps going), take chunks until
chunks 0..t are in the buffer and it can give a batch (a chunk taken early for that counts
towards its own step, so the rate stays the schedule's on average), draw B, update, publish.
A chunk's rollouts are inserted, counted as made, and its seconds counted, when the trainer
takes it. The replay ratio is thus the serial schedule's; the consumption lag logged as
staleness (trainer step minus the version that made a rollout, ``RolloutBuffer.step_stats``)
counts the steps a chunk spent in the making and waiting in the queue.

Checkpoints hold what the serial engine's do plus the order generator, the next chunk index,
and the seconds of the time breakdown. Orders not yet taken at a checkpoint are not in it: a
resumed run orders those chunks again (other problems, new item ids; the old ids are
skipped). Not bitwise: which weights make a chunk depends on the clock.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np

from ..config import Config
from .loop import PHASES, StepResult
from .overlap_sampler import ChunkOrder, SamplerSide
from .seeds import derived_seed
from .serial import Experiment
from .timing import overlap_breakdown

# The orders' generator: (run.seed, ORDER_STREAM) (seeds.py numbers the others 1-7).
ORDER_STREAM = 8


class OverlapRun(Experiment):
    """A run of ``schedule.engine=overlap`` (module docstring): the serial engine's parts with
    production moved to a ``SamplerSide``; the hooks of ``engines.loop.Engine``."""

    def __init__(self, cfg: Config, out_dir: str):
        super().__init__(cfg, out_dir)
        self.order_rng = np.random.default_rng(derived_seed(cfg.run.seed, ORDER_STREAM))
        self.next_chunk = 0  # the first chunk the trainer has not taken
        self.next_order = 0  # the first chunk not ordered
        self.sampler_seconds = {"generate": 0.0, "grade": 0.0, "idle": 0.0}
        self.trainer_wait = 0.0
        self.side: SamplerSide | None = None

    # ---- the sampler side -----------------------------------------------------------------

    @contextmanager
    def session(self, state: dict | None):
        """Start the sampler loop with the current weights and its first orders; stop it at
        the end (after the chunk in the making)."""
        self.side = SamplerSide(self, self.cfg.schedule.overlap_sampler)
        self.side.weights.publish(self.step, self.model)
        self.side.start()
        self.next_order = self.next_chunk
        try:
            self._order_ahead()
            yield
        finally:
            self.side.close()

    def _order(self) -> None:
        """Order chunk ``next_order``: its problems, decoding seed and ids."""
        n, g = self.production.groups_due(self.next_order), self.cfg.schedule.group_size
        problems = self.task.sample_train(n, self.order_rng)
        seed = int(self.order_rng.integers(2**62))
        self.side.order(ChunkOrder(self.next_order, problems, seed, *self.books.new_ids(n, g)))
        self.next_order += 1

    def _order_ahead(self) -> None:
        """Keep ``overlap_ahead`` + 1 orders outstanding, none for a chunk past the last step."""
        ahead = self.cfg.schedule.overlap_ahead
        while self.next_order - self.next_chunk <= ahead and self.next_order < self.cfg.run.steps:
            self._order()

    def _take(self, t: int) -> None:
        """Take the next chunk (waiting: the trainer's idle time) into the buffer at trainer
        step ``t`` and count it as made (ordering it first if it is not yet)."""
        if self.next_order == self.next_chunk:  # past the last step's chunk (a short buffer)
            self._order()
        t0 = time.perf_counter()
        chunk = self.side.take()
        self.trainer_wait += time.perf_counter() - t0
        if chunk.index != self.next_chunk:
            raise RuntimeError(f"overlap engine: chunk {chunk.index} arrived, "
                               f"{self.next_chunk} expected")
        self.buffer.add(chunk.rollouts, insert_step=t)
        self.books.count_made([r.reward for r in chunk.rollouts], chunk.gen_seconds,
                              chunk.tokens)
        for key, value in (("generate", chunk.gen_seconds), ("grade", chunk.grade_seconds),
                           ("idle", chunk.idle_seconds)):
            self.sampler_seconds[key] += value
        self.next_chunk += 1

    # ---- the trainer's step ---------------------------------------------------------------

    def train(self, t: int, evaluate: bool) -> StepResult:
        """Step t of ``engines.loop.run_loop``: evaluate theta_t if ``evaluate`` (the sampler
        keeps going), take chunks until 0..t are in and a batch can be drawn, draw, update,
        publish."""
        evaluation = self.evaluate(t) if evaluate else None
        B = self.cfg.schedule.batch_size
        while self.next_chunk <= t or not self.buffer.can_sample(B):
            self._take(t)
        self.buffer.expire(t)
        batch = self.buffer.sample(B, t, self.rng)
        self.books.consumed += len(batch)
        stats = self.train_step(batch, keep_grad=False)
        self.step = t + 1
        if self.step % self.cfg.schedule.refresh_every == 0 and self.step < self.cfg.run.steps:
            self.side.weights.publish(self.step, self.model)
        self._order_ahead()  # after the publish: a chunk that starts now has theta_{t+1}
        return StepResult(evaluation=evaluation, stats=stats,
                          batch_reward=float(np.mean([r.reward for r in batch])),
                          buffer=self.buffer.step_stats())

    # ---- books and checkpoints ------------------------------------------------------------

    def counters(self) -> dict:
        """``RunBooks.counters``, the trainer's wait for chunks and the time breakdown per
        side (``timing.overlap_breakdown``)."""
        c = self.books.counters(0.0)
        c["trainer_wait_seconds"] = self.trainer_wait
        c["time_breakdown"] = overlap_breakdown(c, self.sampler_seconds, self.trainer_wait)
        return c

    def state_dict(self, log_position: int) -> dict:
        """The serial engine's checkpoint and the overlap's own (module docstring)."""
        state = super().state_dict(log_position)
        state.update({"engine": "overlap", "next_chunk": self.next_chunk,
                      "order_rng": self.order_rng.bit_generator.state,
                      "sampler_seconds": dict(self.sampler_seconds),
                      "trainer_wait": self.trainer_wait})
        return state

    def restore(self, state: dict) -> None:
        """Restore a state saved by ``state_dict`` (before the sampler starts)."""
        if state.get("engine") != "overlap":
            raise ValueError("--resume: the checkpoint was not written by "
                             "schedule.engine=overlap")
        super().restore(state)
        self.next_chunk = state["next_chunk"]
        self.order_rng.bit_generator.state = state["order_rng"]
        self.sampler_seconds.update(state["sampler_seconds"])
        self.trainer_wait = state["trainer_wait"]

    def summary_fields(self) -> dict:
        """Summary fields (``RunBooks.summary``) with the overlap's schedule and seconds."""
        sc = self.cfg.schedule
        return self.books.summary(
            self.counters(), histograms=self.buffer.index.histograms(),
            rollouts_per_step=self.production.rollouts_per_step,
            schedule={"mode": sc.mode, "engine": "overlap", "refresh_every": sc.refresh_every,
                      "overlap_ahead": sc.overlap_ahead, "overlap_sampler": sc.overlap_sampler,
                      "latency": None},
            also=("time_breakdown", "trainer_wait_seconds", *PHASES),
            fields={"warm_start_sha256": self.warm_start_sha256})
