"""The overlapped engine (``schedule.engine=overlap``): sampler and trainer side by side in one
process, each on its own core, so that a serial schedule's saving reaches the clock (issue 37).

The serial engine (``experiment.Experiment``) makes step t's rollouts, then updates: one core
at a time. Here a sampler thread (``SamplerThread``) makes the same quotas, chunk s being the
``Production.groups_due(s)`` groups of mode "on_policy" or "sync", while the trainer (this
thread, the run loop's) updates on earlier chunks:

* sampler -> trainer: ``Chunk`` messages through a FIFO handoff queue of at most
  ``schedule.overlap_ahead`` finished chunks (the sampler blocks on a full queue, so it runs
  at most overlap_ahead + 1 chunks ahead); a failure arrives as a ``SamplerFailure``;
* trainer -> sampler: ``WeightUpdate`` messages in a one-slot mailbox (``WeightMailbox``).
  The trainer publishes a copy of its weights every ``schedule.refresh_every`` steps and
  never waits for the sampler; the sampler takes the newest version when it starts a chunk
  (never inside one), so every rollout carries the exact version that made it;
* the trainer's step t: evaluate theta_t if due (the sampler keeps going), take chunks until
  chunks 0..t are in the buffer and it can give a batch (a chunk taken early for that counts
  towards its own step, so the rate stays the schedule's on average), draw B, update,
  publish. The rollouts of a chunk are inserted, counted as made and their generation
  seconds counted when the trainer takes it, as the Ray engine's driver does.

The replay ratio is therefore the serial schedule's; the staleness differs: the consumption
lag logged (trainer step minus the weight version that made a rollout,
``RolloutBuffer.step_stats``) counts the steps a chunk spent in the making and in the queue.

Threads: torch runs an operator on the calling thread when ``run.threads`` = 1, so the two
threads compute on two cores; the Python between operators holds the GIL, which is what can
keep the overlap short of its ideal (``benchmarks/overlap.py`` measures it). Evaluation uses
the trainer's own sampler (``Experiment.sampler``); the sampler thread has its own copy of the
policy and of the tokenizer.

Checkpoints hold what the serial engine's do plus the sampler's generator, the next chunk
index and the time breakdown's seconds; chunks made but not yet taken at a checkpoint are not
in it: a resumed run makes those steps' chunks again with new item ids (the old ids are
skipped). Not bitwise: which weights make a chunk depends on the clock.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..config import Config
from ..rl.buffer import Rollout
from ..rl.trainer import grade_rollouts
from ..samplers import WeightUpdate
from ..samplers.make import make_sampler
from .serial import Experiment
from .loop import PHASES, StepResult
from .seeds import derived_seed
from .timing import overlap_breakdown

# The sampler thread's generator: (run.seed, SAMPLER_STREAM) (seeds.py keeps 1-7).
SAMPLER_STREAM = 8
# Seconds between looks at the queue while waiting (to notice a dead thread or a stop).
POLL_SECONDS = 0.5
# Seconds to wait for the sampler thread to finish its chunk when the run ends.
JOIN_SECONDS = 600.0


@dataclass(frozen=True)
class Chunk:
    """Message sampler -> trainer: the rollouts of chunk ``index`` (the groups due before
    trainer step ``index``), made with weight ``version`` in ``gen_seconds`` (>= 0) of
    decoding over ``tokens`` prompt and completion tokens."""

    index: int
    version: int
    rollouts: list[Rollout]
    gen_seconds: float
    tokens: int


@dataclass(frozen=True)
class SamplerFailure:
    """Message sampler -> trainer: the sampler thread stopped on ``error`` (one line)."""

    error: str


class WeightMailbox:
    """The newest published weights, one slot: ``publish`` replaces it (a copy of the model's
    weights, taken under no lock the sampler holds for long), ``latest`` reads it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._update: WeightUpdate | None = None

    def publish(self, version: int, model) -> None:
        """Make a copy of ``model``'s weights the newest version (``version`` >= 0)."""
        state = {k: t.detach().clone() for k, t in model.state_dict().items()}
        with self._lock:
            self._update = WeightUpdate(version, state)

    def latest(self) -> WeightUpdate | None:
        """The newest published weights (None before the first publish)."""
        with self._lock:
            return self._update


class SamplerThread:
    """The sampler side: makes chunk after chunk from ``first_chunk`` on and puts them into
    ``queue`` (at most ``ahead`` >= 1 waiting). ``lock`` guards what a checkpoint reads of it
    (its generator, the run's next ids); ``seconds``: its generate, grade and idle seconds
    (idle: blocked on a full queue), over every session."""

    def __init__(self, run: "OverlapRun", first_chunk: int, ahead: int, seconds: dict):
        self.run, self.next_chunk = run, first_chunk
        self.queue: queue.Queue = queue.Queue(maxsize=ahead)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.seconds = seconds
        cfg = run.cfg
        self.sampler = make_sampler(cfg, run.model, run.tokenizer)
        self.tokenizer = copy.deepcopy(run.tokenizer)
        self.thread = threading.Thread(target=self._main, name="overlap-sampler", daemon=True)

    def _main(self) -> None:
        try:
            while not self.stop.is_set():
                chunk = self._make(self.next_chunk)
                self.next_chunk += 1
                if not self._put(chunk):
                    return
        except Exception as exc:  # reported to the trainer, which raises it
            self._put(SamplerFailure(f"{type(exc).__name__}: {exc}".splitlines()[0]))

    def _put(self, item) -> bool:
        """Hand ``item`` to the trainer, waiting for room (idle time); False if stopped."""
        t0 = time.perf_counter()
        try:
            while not self.stop.is_set():
                try:
                    self.queue.put(item, timeout=POLL_SECONDS)
                    return True
                except queue.Full:
                    continue
            return False
        finally:
            self.seconds["idle"] += time.perf_counter() - t0

    def _make(self, index: int) -> Chunk:
        """Chunk ``index``: its groups made with the newest published weights, graded."""
        run, cfg = self.run, self.run.cfg
        g, s = cfg.schedule.group_size, cfg.sampler
        update = run.mailbox.latest()
        if update.version != self.sampler.version:
            self.sampler.load_weights(update)
        n = run.production.groups_due(index)
        with self.lock:
            problems = run.task.sample_train(n, run.sampler_rng)
            seed = int(run.sampler_rng.integers(2**62))
            ids = run.books.new_ids(n, g)
        if n == 0:
            return Chunk(index, update.version, [], 0.0, 0)
        prompts = [run.encode(p) for p in problems for _ in range(g)]
        t0 = time.perf_counter()
        gen = self.sampler.generate(prompts, max_new_tokens=s.max_new_tokens,
                                    temperature=s.temperature, top_p=s.top_p, seed=seed)
        t1 = time.perf_counter()
        rollouts = grade_with(run, self.tokenizer, problems, gen, update.version, ids)
        self.seconds["generate"] += t1 - t0
        self.seconds["grade"] += time.perf_counter() - t1
        return Chunk(index, update.version, rollouts, t1 - t0,
                     int(sum(len(p) for p in prompts) + gen.lengths.sum()))

    def take(self) -> Chunk:
        """The next chunk (waiting for it); RuntimeError if the sampler failed or died."""
        while True:
            try:
                item = self.queue.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError("overlap engine: the sampler thread ended without "
                                       "a chunk") from None
        if isinstance(item, SamplerFailure):
            raise RuntimeError(f"overlap engine: the sampler thread failed: {item.error}")
        return item

    def close(self) -> None:
        """Stop after the chunk in the making (waits for it, at most ``JOIN_SECONDS``)."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(JOIN_SECONDS)


def grade_with(run: "OverlapRun", tokenizer, problems, gen, version: int,
               ids: tuple[int, int]) -> list[Rollout]:
    """``trainer.grade_rollouts`` with the sampler thread's own tokenizer."""
    return grade_rollouts(run.cfg, run.task, tokenizer, run.encode, problems, gen, version,
                          *ids)


class OverlapRun(Experiment):
    """A run of ``schedule.engine=overlap`` (module docstring): the serial engine's parts,
    with production moved to a ``SamplerThread``; the hooks of ``engines.loop.Engine``."""

    def __init__(self, cfg: Config, out_dir: str):
        super().__init__(cfg, out_dir)
        self.sampler_rng = np.random.default_rng(derived_seed(cfg.run.seed, SAMPLER_STREAM))
        self.mailbox = WeightMailbox()
        self.next_chunk = 0  # the first chunk the trainer has not taken
        self.sampler_seconds = {"generate": 0.0, "grade": 0.0, "idle": 0.0}
        self.trainer_wait = 0.0
        self.worker: SamplerThread | None = None

    # ---- the sampler thread ---------------------------------------------------------------

    @contextmanager
    def session(self, state: dict | None):
        """Publish the current weights and start the sampler thread at the first chunk not
        taken; stop it at the end (after the chunk in the making)."""
        self.mailbox.publish(self.step, self.model)
        self.worker = SamplerThread(self, self.next_chunk, self.cfg.schedule.overlap_ahead,
                                    self.sampler_seconds)
        self.worker.thread.start()
        try:
            yield
        finally:
            self.worker.close()

    def _take(self, t: int) -> None:
        """Take the next chunk (waiting: the trainer's idle time) into the buffer at trainer
        step ``t`` and count it as made."""
        t0 = time.perf_counter()
        chunk = self.worker.take()
        self.trainer_wait += time.perf_counter() - t0
        if chunk.index != self.next_chunk:
            raise RuntimeError(f"overlap engine: chunk {chunk.index} arrived, "
                               f"{self.next_chunk} expected")
        self.buffer.add(chunk.rollouts, insert_step=t)
        self.books.count_made([r.reward for r in chunk.rollouts], chunk.gen_seconds,
                              chunk.tokens)
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
        if self.step == self.cfg.run.steps:
            self.worker.stop.set()  # no chunk is needed any more
        elif self.step % self.cfg.schedule.refresh_every == 0:
            self.mailbox.publish(self.step, self.model)
        return StepResult(evaluation=evaluation, stats=stats,
                          batch_reward=float(np.mean([r.reward for r in batch])),
                          buffer=self.buffer.step_stats())

    # ---- books and checkpoints ------------------------------------------------------------

    def counters(self) -> dict:
        """``RunBooks.counters``, the trainer's wait for chunks and the time breakdown per
        side (``timing.overlap_breakdown``)."""
        c = self.books.counters(0.0)
        c["trainer_wait_seconds"] = self.trainer_wait
        c["time_breakdown"] = overlap_breakdown(c, dict(self.sampler_seconds),
                                                self.trainer_wait)
        return c

    def state_dict(self, log_position: int) -> dict:
        """The serial engine's checkpoint and the overlap's own (module docstring); taken
        under the sampler's lock, so its generator and the next ids agree."""
        lock = self.worker.lock if self.worker else threading.Lock()
        with lock:
            state = super().state_dict(log_position)
            state.update({"engine": "overlap", "next_chunk": self.next_chunk,
                          "sampler_rng": self.sampler_rng.bit_generator.state,
                          "sampler_seconds": dict(self.sampler_seconds),
                          "trainer_wait": self.trainer_wait})
        return state

    def restore(self, state: dict) -> None:
        """Restore a state saved by ``state_dict`` (before the sampler thread starts)."""
        if state.get("engine") != "overlap":
            raise ValueError("--resume: the checkpoint was not written by "
                             "schedule.engine=overlap")
        super().restore(state)
        self.next_chunk = state["next_chunk"]
        self.sampler_rng.bit_generator.state = state["sampler_rng"]
        self.sampler_seconds.update(state["sampler_seconds"])
        self.trainer_wait = state["trainer_wait"]

    def summary_fields(self) -> dict:
        """Summary fields (``RunBooks.summary``) with the overlap's schedule and seconds."""
        sc = self.cfg.schedule
        return self.books.summary(
            self.counters(), histograms=self.buffer.index.histograms(),
            rollouts_per_step=self.production.rollouts_per_step,
            schedule={"mode": sc.mode, "engine": "overlap", "refresh_every": sc.refresh_every,
                      "overlap_ahead": sc.overlap_ahead, "latency": None},
            also=("time_breakdown", "trainer_wait_seconds", *PHASES),
            fields={"warm_start_sha256": self.warm_start_sha256})
