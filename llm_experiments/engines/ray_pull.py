"""The Ray engine with the driver out of the per-step loop (``schedule.ray_loop=actors``).

``ray_engine.RayRun``'s driver starts every trainer step, passes every finished chunk on to
the buffer actor and restarts its sampler, and holds the weight references the samplers get:
each of those is a round trip through the driver, and the trainer waits on the driver
between steps. Here the actors run the loop among themselves (same placement, same actors'
code for a chunk and for a step):

* ``PullBuffer`` (the buffer actor) also hands out orders (problems, seed, item ids: its own
  generator and counters, in its checkpointed state), takes finished chunks, holds the
  newest published weights (a reference, plus the versions to evaluate) and collects each
  step's reports;
* each ``PullSampler`` loops: order, the newest weights if it lacks them, chunk, push;
* the ``PullTrainer`` ranks run a block of steps, up to the next checkpoint: each step waits
  until the buffer can give a batch, pulls its part, updates; rank 0 publishes its weights
  (every ``schedule.refresh_every`` steps and at the versions to evaluate) to the buffer
  actor as an object reference, without the driver;
* the driver (``RayPullRun``) starts the blocks, reads each step's reports for the records
  (the run loop of every engine, ``engines.loop``), evaluates theta_t while the trainers go
  on, and checkpoints at the block ends, when the trainers are idle.

Mode "async" (as the driver's loop): each order is ``chunk_groups`` groups, the samplers make
what the clock allows. Mode "sync" (the serial schedule's quotas, as ``engines.overlap``):
order s is the groups due before step s, at most ``schedule.overlap_ahead`` orders beyond the
steps done, and step t waits until chunks 0..t are in; so the replay ratio is the serial
run's, and the staleness counts the steps a chunk waited. A chunk's rollouts are inserted
on arrival, at the step after the last drawn one, and counted in the first step whose
reports the driver reads after it arrived; the chunks the buffer holds at a checkpoint are
counted before it is written, and after the last step no order goes out and the samplers'
last chunks are counted, so the books agree with the buffer. Chunks in flight at a kill are
lost on ``--resume`` (their item ids skipped), as with the driver's loop. Not with the probes
or the LIFO queue: both need the driver to pause the samplers.

Nobody polls: a trainer, a sampler or the driver that has to wait does so inside the buffer
actor (an asyncio actor: its plain methods run one at a time on its event loop, so its state
needs no lock), and every change that could end a wait wakes the waiters. On a small machine
each look of a polling loop was a Ray call whose CPU the sampler and the trainer share.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager

import numpy as np
import ray

from ..config import Config
from ..rl.schedule import Production
from ..samplers import WeightUpdate
from ..tasks.make import make_task
from .metrics import evaluate
from .ray_actors import STALL_SECONDS, BufferHolder, SamplerWorker, TrainerRank
from .ray_engine import RayRun, connect
from .ray_plan import chunk_groups
from .seeds import EVAL_STREAM, derived_seed

# Seconds one wait inside the buffer actor lasts before its caller asks again: the driver
# then looks for a failed actor and a stall, so this bounds how late it sees one.
WAIT_SECONDS = 1.0
# The buffer actor's order generator: (run.seed, ORDERS_STREAM) (seeds.py numbers 1-7).
ORDERS_STREAM = 9


class PullBuffer(BufferHolder):
    """The buffer actor of the actors' loop (module docstring): ``BufferHolder`` plus orders,
    the weights board and the step reports. ``state``: a checkpoint's ``state_dict``."""

    def __init__(self, cfg: Config, state: dict | None = None):
        super().__init__(cfg, state)
        sc = cfg.schedule
        self.task, self.group_size = make_task(cfg.task), sc.group_size
        self.chunk = chunk_groups(sc.batch_size, sc.workers, sc.group_size)
        # mode sync: chunk s is the groups due before step s (``schedule.Production``)
        self.quota = Production(sc) if sc.mode == "sync" else None
        self.ahead, self.steps = sc.overlap_ahead, cfg.run.steps
        self.order_rng = np.random.default_rng(derived_seed(cfg.run.seed, ORDERS_STREAM))
        self.next_item = self.next_group = self.next_step = 0
        if state is not None:
            pull = state["pull"]
            self.order_rng.bit_generator.state = pull["order_rng"]
            self.next_item, self.next_group, self.next_step = \
                pull["next_item"], pull["next_group"], pull["next_step"]
        # sync: the first chunk not yet inserted, those inserted beyond it, the next chunk to
        # order (those in flight at a checkpoint are ordered again after a resume), the steps
        # done (orders run ahead of them) and whether a trainer waits for more
        self.contiguous, self.beyond = 0, set()
        if state is not None:
            self.contiguous, self.beyond = pull["contiguous"], set(pull["beyond"])
        self.next_order, self.steps_done = self.contiguous, self.next_step
        self.starved = False
        self.newest: tuple | None = None  # (version, [reference])
        self.kept: dict = {}  # version -> [reference], to evaluate
        self.made: list = []  # (sampler index, ChunkReport) not yet read
        self.reports: dict = {}  # step -> {rank: StepReport}
        self.stopped = False
        self.change = asyncio.Event()  # set (and replaced) at every change a waiter awaits

    def _changed(self) -> None:
        """Wake every waiter (``_wait``): it looks again at what it waits for."""
        self.change.set()
        self.change = asyncio.Event()

    async def _wait(self, seconds: float) -> None:
        """Until the next change (``_changed``) or ``seconds`` (> 0) pass."""
        try:
            await asyncio.wait_for(self.change.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _until(self, look, seconds: float):
        """``look()``'s first answer other than "wait" (``look`` is called again at each
        change), or "wait" after ``seconds`` (> 0)."""
        end = time.monotonic() + seconds
        while (got := look()) == "wait" and (left := end - time.monotonic()) > 0:
            await self._wait(left)
        return got

    async def await_order(self, seconds: float):
        """``order``'s answer, waiting up to ``seconds`` while it is "wait"."""
        return await self._until(self.order, seconds)

    async def await_ready(self, step: int, seconds: float) -> bool:
        """``ready_for(step)``, waiting up to ``seconds`` while it is False."""
        got = await self._until(lambda: True if self.ready_for(step) else "wait", seconds)
        return got is True

    async def await_step(self, step: int, ranks: int, seconds: float):
        """``pop_step``'s answer, waiting up to ``seconds`` while it is None."""
        got = await self._until(lambda: self.pop_step(step, ranks) or "wait", seconds)
        return None if got == "wait" else got

    def order(self):
        """(chunk index, problems, seed, first item id, first group id) of the next chunk;
        None to stop (asked to, or every step done); "wait" while mode sync's quota has run
        ``overlap_ahead`` chunks ahead of the steps done or reached the last step's (unless a
        trainer waits for more)."""
        if self.stopped or self.steps_done >= self.steps:
            return None
        n = self.chunk
        if self.quota is not None:
            while self.next_order in self.beyond or \
                    self.quota.groups_due(self.next_order) == 0:  # in, or nothing to make
                self._inserted(self.next_order)
                self.next_order += 1
            beyond = self.next_order > self.steps_done + self.ahead or \
                self.next_order >= self.steps  # no chunk past the last step's
            if beyond and not self.starved:
                return "wait"
            self.starved = False
            n = self.quota.groups_due(self.next_order)
        problems = self.task.sample_train(n, self.order_rng)
        seed = int(self.order_rng.integers(2**62))
        first = self.next_item, self.next_group
        self.next_item += n * self.group_size
        self.next_group += n
        self.next_order += 1
        return self.next_order - 1, problems, seed, *first

    def _inserted(self, index: int) -> None:
        """Chunk ``index`` is in the buffer (or had nothing to make)."""
        self.beyond.add(index)
        while self.contiguous in self.beyond:
            self.beyond.discard(self.contiguous)
            self.contiguous += 1
        self._changed()

    def ready_for(self, step: int) -> bool:
        """Whether trainer step ``step`` can draw: every shard can give its part and, in mode
        sync, chunks 0..step are in (a trainer that still cannot draw lets one more chunk be
        ordered)."""
        if self.quota is not None and self.contiguous <= step:
            return False
        ok = self.buffer.can_sample(self.batch_size)
        if not ok and not self.starved:  # a sampler waiting for an order may make one more
            self.starved = True
            self._changed()
        return ok

    def publish(self, version: int, box: list, keep: bool) -> None:
        """``box``: [the reference to weights ``version``] (in a list, so Ray passes the
        reference itself); ``keep``: hold it for an evaluation too."""
        self.newest = (version, box)
        if keep:
            self.kept[version] = box

    def latest(self) -> tuple:
        """(version, [reference]) of the newest published weights."""
        return self.newest

    def weights_for(self, version: int) -> list:
        """[reference] of kept version ``version`` (once)."""
        return self.kept.pop(version)

    def add_chunk(self, rollouts: list, index: int, report, chunk: int) -> int:
        """Insert sampler ``index``'s chunk number ``chunk`` at the step after the last
        drawn; returns the rollouts held."""
        self.buffer.add(rollouts, insert_step=self.next_step)
        self.made.append((index, report))
        self._inserted(chunk)
        return len(self.buffer)

    def sample(self, n: int, step: int, shard: int) -> list:
        """``BufferHolder.sample``; chunks arriving later go in at ``step`` + 1."""
        batch = super().sample(n, step, shard)
        self.next_step = max(self.next_step, step + 1)
        return batch

    def step_done(self, step: int, rank: int, report) -> None:
        """Trainer ``rank`` finished ``step`` (``report``: its StepReport; its weights are
        published, so orders may run one step further)."""
        self.reports.setdefault(step, {})[rank] = report
        self.steps_done = max(self.steps_done, step + 1)
        self._changed()

    def pop_step(self, step: int, ranks: int):
        """(the ``ranks`` StepReports of ``step`` in rank order, the chunks made since the
        last call), or None while a rank has not reported."""
        got = self.reports.get(step, {})
        if len(got) < ranks:
            return None
        del self.reports[step]
        made, self.made = self.made, []
        return [got[k] for k in range(ranks)], made

    def take_made(self) -> list:
        """The chunks made since the driver last read them (taken)."""
        made, self.made = self.made, []
        return made

    def stop(self) -> None:
        """Hand out no more orders (the samplers' loops end)."""
        self.stopped = True
        self._changed()

    def state_dict(self) -> dict:
        """``BufferHolder.state_dict``, the orders' generator and counters, and the chunks
        made since the driver last read them (key "made", taken: the driver counts them
        before it writes the checkpoint, so its books agree with the buffer's contents)."""
        made, self.made = self.made, []
        return {**super().state_dict(), "made": made, "pull": {
            "order_rng": self.order_rng.bit_generator.state, "next_item": self.next_item,
            "next_group": self.next_group, "next_step": self.next_step,
            "contiguous": self.contiguous, "beyond": sorted(self.beyond)}}


class PullSampler(SamplerWorker):
    """A sampler actor that loops on its own (``loop``)."""

    def loop(self, buffer, index: int) -> None:
        """Order, newest weights, chunk, push; until the buffer hands out no more orders."""
        version = None
        while True:
            order = ray.get(buffer.await_order.remote(WAIT_SECONDS))
            if order is None:
                return
            if order == "wait":
                continue
            newest, box = ray.get(buffer.latest.remote())
            weights = ray.get(box[0]) if newest != version else None
            report, rollouts = self.produce(order[1], newest, weights, *order[2:])
            version = newest
            ray.get(buffer.add_chunk.remote(rollouts, index, report, order[0]))


class PullTrainer(TrainerRank):
    """A trainer rank that runs blocks of steps on its own (``run_block``)."""

    def run_block(self, first: int, end: int) -> None:
        """Steps ``first`` to ``end`` - 1: wait until the buffer can give a batch, pull this
        rank's part and update (``TrainerRank.step``); rank 0 publishes to the buffer actor
        every ``refresh_every`` steps and at the versions evaluated; every rank reports."""
        cfg = self.cfg
        for t in range(first, end):
            while not ray.get(self.buffer.await_ready.remote(t, WAIT_SECONDS)):
                pass
            keep = (t + 1) % cfg.eval.every == 0 or t + 1 == cfg.run.steps
            publish = self.rank == 0 and (keep or (t + 1) % cfg.schedule.refresh_every == 0)
            report, weights = self.step(t, publish, ())
            if weights is not None:
                self.buffer.publish.remote(t + 1, [ray.put(weights)], keep)
            ray.get(self.buffer.step_done.remote(t, self.rank, report))


class RayPullRun(RayRun):
    """The driver of ``schedule.ray_loop=actors`` (module docstring): ``RayRun``'s placement,
    books, checkpoints and summary, with the actors' loop."""

    holder = PullBuffer
    sampler_class = PullSampler
    trainer_class = PullTrainer

    @contextmanager
    def session(self, state: dict | None):
        """Connect, start the actors (from ``state`` if resuming), publish the current
        weights and start the samplers' loops; stop them at the end."""
        ours = connect(self.address)
        try:
            self._start(state)
            self._get(self.buffer.publish.remote(self.step, [self.weights[self.step]], True),
                      "buffer")
            self.loops = [s.loop.remote(self.buffer, i) for i, s in enumerate(self.samplers)]
            self.block, self.block_end = None, self.step
            yield
        finally:
            if hasattr(self, "buffer"):
                self.buffer.stop.remote()
            self._stop()
            if ours:
                ray.shutdown()

    def train(self, t: int, evaluate: bool):
        """Step t of ``engines.loop.run_loop``: start the trainers' block if none runs,
        evaluate theta_t meanwhile if ``evaluate``, read step t's reports and count them."""
        if self.block is None:
            ce = self.cfg.run.checkpoint_every
            self.block_end = min(self.cfg.run.steps, (t // ce + 1) * ce)
            self.block = [tr.run_block.remote(t, self.block_end) for tr in self.trainers]
        evaluation = self.evaluate(t) if evaluate else None
        reports, made = self._reports(t)
        self._count_made(made)
        self.step = t + 1
        if self.step == self.block_end:  # the trainers are idle until the next block
            self._get(self.block, "trainer")
            self.block = None
        if self.step == self.cfg.run.steps:  # the samplers stop: count their last chunks
            self._get(self.loops, "sampler")
            self._count_made(self._get(self.buffer.take_made.remote(), "buffer"))
        return self._account(t, reports, evaluation)

    def _count_made(self, made: list) -> None:
        """Count chunks made (``(sampler index, ChunkReport)`` pairs) into the books."""
        for i, rep in made:
            self.books.count_made(rep.rewards, rep.gen_seconds, rep.tokens)
            self.actor_books.add_busy(f"sampler{i}", rep.busy_seconds)
            self.actor_books.injected_gen_delay_seconds += rep.injected_seconds

    def _buffer_state(self) -> dict:
        """The buffer actor's state, the chunks it reports with it counted first."""
        state = self._get(self.buffer.state_dict.remote(), "buffer")
        self._count_made(state.pop("made"))
        return state

    def _reports(self, t: int) -> tuple[list, list]:
        """Step t's StepReports and the chunks made meanwhile, waiting for them (an actor
        that failed stops the run with its error)."""
        t0 = time.perf_counter()
        while True:
            # Looked at first: a block that ended has reported its last step already.
            done, _ = ray.wait(self.block + self.loops, timeout=0)
            got = self._get(self.buffer.await_step.remote(t, len(self.trainers), WAIT_SECONDS),
                            "buffer")
            if got is not None:
                return got
            if done:
                self._get(done, "trainer or sampler")  # raises the actor's error
                raise RuntimeError(f"Ray engine: an actor's loop ended before step {t}")
            if time.perf_counter() - t0 > STALL_SECONDS:
                raise RuntimeError(f"Ray engine: step {t} reported nothing in "
                                   f"{STALL_SECONDS:g} s (LLM_EXPERIMENTS_RAY_STALL_SECONDS)")

    def evaluate(self, t: int) -> dict:
        """Held-out accuracy and pass@k of theta_t, from the version the trainers kept."""
        t0 = time.perf_counter()
        box = self._get(self.buffer.weights_for.remote(t), "buffer")
        self.evaluator.load_weights(WeightUpdate(t, self._get(box[0], "trainer0")))
        out = evaluate(self.evaluator, self.tokenizer, self.task, self.eval_prompts, self.cfg,
                       seed=derived_seed(self.cfg.run.seed, t, EVAL_STREAM))
        self.actor_books.phases["eval_seconds"] += time.perf_counter() - t0
        return out
