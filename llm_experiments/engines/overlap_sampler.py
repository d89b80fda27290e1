"""The sampler side of the overlapped engine (``overlap.py``): messages, the weight channel and
the sampler loop, in a thread of the run's process or in a child process
(``schedule.overlap_sampler``).

Messages (plain dataclasses, picklable):

* ``ChunkOrder`` trainer -> sampler: which problems to make, with which seed and item ids.
  The trainer draws them from the run's own generator, so a checkpoint holds all the run's
  randomness, whichever side is where;
* ``Chunk`` sampler -> trainer: the graded rollouts of one order, the weight version that
  made them and the sampler's seconds (decoding, grading, waiting for the order);
* ``SamplerFailure`` sampler -> trainer: the loop stopped on an error (one line).

Weights travel trainer -> sampler through a one-slot channel the trainer writes without
waiting for the sampler: ``WeightMailbox`` (a thread: a reference to a copy swapped under a
lock) or ``SharedWeights`` (a process: tensors in shared memory, copied under a lock held
for the copy alone, ~1 ms for cpu_long's 0.25M parameters). The sampler takes the newest
version when it starts a chunk, never inside one.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import torch

from ..rl.buffer import Rollout
from ..rl.trainer import grade_rollouts
from ..samplers import WeightUpdate
from ..samplers.make import make_sampler

# Seconds between looks at the result queue while waiting (to notice a dead sampler).
POLL_SECONDS = 0.5
# Seconds to wait for the sampler to finish its chunk when the run ends.
JOIN_SECONDS = 600.0


@dataclass(frozen=True)
class ChunkOrder:
    """Message trainer -> sampler: make chunk ``index``, G rollouts of each of ``problems``
    (``tasks.Problem``), decoding with ``seed``, item ids from ``first_item`` and group ids
    from ``first_group``."""

    index: int
    problems: list
    seed: int
    first_item: int
    first_group: int


@dataclass(frozen=True)
class Chunk:
    """Message sampler -> trainer: the rollouts of chunk ``index``, made with weight
    ``version``; the sampler's seconds for it (>= 0): ``gen_seconds`` decoding,
    ``grade_seconds`` grading, ``idle_seconds`` waiting for its order; ``tokens``: prompt and
    completion tokens decoded."""

    index: int
    version: int
    rollouts: list[Rollout]
    gen_seconds: float
    grade_seconds: float
    idle_seconds: float
    tokens: int


@dataclass(frozen=True)
class SamplerFailure:
    """Message sampler -> trainer: the sampler loop stopped on ``error`` (one line)."""

    error: str


class WeightMailbox:
    """One slot of weights for a sampler thread: ``publish`` swaps in a copy, ``load_newest``
    loads it into a sampler if it is newer."""

    def __init__(self):
        self._lock = threading.Lock()
        self._update: WeightUpdate | None = None

    def publish(self, version: int, model) -> None:
        """Make a copy of ``model``'s weights the newest ``version`` (>= 0)."""
        state = {k: t.detach().clone() for k, t in model.state_dict().items()}
        with self._lock:
            self._update = WeightUpdate(version, state)

    def load_newest(self, sampler) -> int:
        """Load the newest weights into ``sampler`` unless it has them; returns the version."""
        with self._lock:
            update = self._update
        if update.version != sampler.version:
            sampler.load_weights(update)
        return update.version


class SharedWeights:
    """One slot of weights in shared memory for a sampler process (``ctx``: a spawn
    multiprocessing context); the same interface as ``WeightMailbox``."""

    def __init__(self, ctx, model):
        self.state = {k: t.detach().clone().share_memory_()
                      for k, t in model.state_dict().items()}
        self.version = ctx.Value("q", -1, lock=False)
        self.lock = ctx.Lock()

    def publish(self, version: int, model) -> None:
        """Copy ``model``'s weights in as the newest ``version`` (>= 0)."""
        with self.lock, torch.no_grad():
            for k, t in model.state_dict().items():
                self.state[k].copy_(t)
            self.version.value = version

    def load_newest(self, sampler) -> int:
        """Load the newest weights into ``sampler`` unless it has them; returns the version."""
        with self.lock:
            version = self.version.value
            if version != sampler.version:
                sampler.load_weights(WeightUpdate(version, self.state))
        return version


class ChunkMaker:
    """Makes chunks from orders: its own sampler (a copy of ``model``) and grading with
    ``tokenizer`` and ``task`` as ``cfg`` sets them."""

    def __init__(self, cfg, task, model, tokenizer):
        from ..policy.models import encode_prompt
        self.cfg, self.task, self.tokenizer = cfg, task, tokenizer
        self.sampler = make_sampler(cfg, model, tokenizer)
        self._encode = lambda p: encode_prompt(tokenizer, p.prompt, cfg.task.chat_template)

    def make(self, order: ChunkOrder, weights, idle: float) -> Chunk:
        """Chunk ``order.index`` with the newest weights of ``weights`` (a mailbox); ``idle``:
        seconds spent waiting for the order."""
        version = weights.load_newest(self.sampler)
        if not order.problems:
            return Chunk(order.index, version, [], 0.0, 0.0, idle, 0)
        g, s = self.cfg.schedule.group_size, self.cfg.sampler
        prompts = [self._encode(p) for p in order.problems for _ in range(g)]
        t0 = time.perf_counter()
        gen = self.sampler.generate(prompts, max_new_tokens=s.max_new_tokens,
                                    temperature=s.temperature, top_p=s.top_p, seed=order.seed)
        t1 = time.perf_counter()
        rollouts = grade_rollouts(self.cfg, self.task, self.tokenizer, self._encode,
                                  order.problems, gen, version, order.first_item,
                                  order.first_group)
        return Chunk(order.index, version, rollouts, t1 - t0, time.perf_counter() - t1, idle,
                     int(sum(len(p) for p in prompts) + gen.lengths.sum()))


def _next_order(orders, alive) -> ChunkOrder | None:
    """The next order, waiting for it; None to stop (a None order, or ``alive()`` false)."""
    while True:
        try:
            return orders.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if not alive():
                return None


def serve(maker: ChunkMaker, weights, orders, results, alive=lambda: True) -> None:
    """The sampler loop: take an order (None = stop), make its chunk, put it; an error is
    put as a ``SamplerFailure`` and ends the loop, and so does ``alive()`` turning false
    while it waits (a sampler process whose run was killed)."""
    while True:
        t0 = time.perf_counter()
        order = _next_order(orders, alive)
        if order is None:
            return
        try:
            chunk = maker.make(order, weights, time.perf_counter() - t0)
        except Exception as exc:  # reported to the trainer, which raises it
            results.put(SamplerFailure(f"{type(exc).__name__}: {exc}".splitlines()[0]))
            return
        results.put(chunk)


def _process_main(cfg, weights: SharedWeights, orders, results) -> None:
    """A sampler process: build the policy as the run does, then ``serve``."""
    from ..policy.kernels import use_fast_linear
    from ..policy.models import load_policy
    from ..tasks.make import make_task
    try:
        torch.set_num_threads(cfg.run.threads)
        task = make_task(cfg.task)
        model, tokenizer = load_policy(cfg, task)
        if cfg.run.fast_kernels:
            use_fast_linear(model)
        maker = ChunkMaker(cfg, task, model, tokenizer)
    except Exception as exc:
        results.put(SamplerFailure(f"start-up: {type(exc).__name__}: {exc}".splitlines()[0]))
        return
    import multiprocessing
    serve(maker, weights, orders, results, alive=multiprocessing.parent_process().is_alive)


class SamplerSide:
    """The trainer's handle on the sampler loop, in a thread or a child process
    (``backend``, one of ``engines.OVERLAP_SAMPLERS``): ``weights`` to publish into, ``order``,
    ``take``, ``close``. ``run``: the ``serial.Experiment`` whose policy it copies."""

    def __init__(self, run, backend: str):
        self.backend = backend
        if backend == "thread":
            import copy
            self.weights = WeightMailbox()
            self.orders, self.results = queue.Queue(), queue.Queue()
            maker = ChunkMaker(run.cfg, run.task, run.model, copy.deepcopy(run.tokenizer))
            self.worker = threading.Thread(target=serve, name="overlap-sampler", daemon=True,
                                           args=(maker, self.weights, self.orders,
                                                 self.results))
        else:
            ctx = torch.multiprocessing.get_context("spawn")
            self.weights = SharedWeights(ctx, run.model)
            self.orders, self.results = ctx.Queue(), ctx.Queue()
            self.worker = ctx.Process(target=_process_main, name="overlap-sampler",
                                      daemon=True, args=(run.cfg, self.weights, self.orders,
                                                         self.results))

    def start(self) -> None:
        """Start the loop (publish the first weights before)."""
        self.worker.start()

    def order(self, order: ChunkOrder) -> None:
        """Queue an order (never waits)."""
        self.orders.put(order)

    def take(self) -> Chunk:
        """The next chunk, waiting for it; RuntimeError if the sampler failed or ended."""
        while True:
            try:
                item = self.results.get(timeout=POLL_SECONDS)
                break
            except queue.Empty:
                if not self.worker.is_alive():
                    raise RuntimeError(f"overlap engine: the sampler {self.backend} ended "
                                       f"without a chunk") from None
        if isinstance(item, SamplerFailure):
            raise RuntimeError(f"overlap engine: the sampler {self.backend} failed: "
                               f"{item.error}")
        return item

    def close(self) -> None:
        """Stop after the chunk in the making (waits for it, at most ``JOIN_SECONDS``)."""
        if self.worker.is_alive():
            try:  # orders not started are dropped
                while True:
                    self.orders.get_nowait()
            except queue.Empty:
                pass
            self.orders.put(None)
            self.worker.join(JOIN_SECONDS)
        if self.backend == "process":
            if self.worker.is_alive():
                self.worker.terminate()
            self.orders.cancel_join_thread()
            self.results.cancel_join_thread()
