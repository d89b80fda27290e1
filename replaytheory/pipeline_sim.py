"""Discrete-event simulation of the asynchronous producer/consumer system (theory.md s1-2).

W inference workers generate rollouts with a possibly stale copy of the weights; T trainers
consume batches in synchronous data-parallel steps. Which rollouts sit in the buffer and which
are drawn is decided by ``buffer.ReplayIndex`` (FIFO of capacity N, sharded or not, sampling
modes, positive bias delta, or the LIFO no-buffer queue), so the simulator and the LLM harness
share one implementation of the buffer semantics.

Time unit: C, the trainer compute of one update on the whole batch (section 3). One step takes
C/T of wall time on T trainers; a worker generates ``chunk`` rollouts in ``chunk * mu / B`` of
wall time (mu = cost of one batch of B rollouts over C). Hence production is W B / mu and
consumption T B rollouts per unit time, and the average replay ratio tends to mu T / W.

Weights: the trainers publish their weights every ``refresh_every`` steps; a worker starts each
chunk with the latest published version, so a rollout's generation step is that version.
With the LIFO queue (no buffer) workers block while the queue is full: no rollout is wasted and
a worker's idle time is the time it waits for room.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from . import _validate as v
from .buffer import SAMPLING_MODES, ReplayIndex

_WORKER, _TRAINER = 0, 1  # event kinds; at equal times insertions are handled first


@dataclass(frozen=True)
class PipelineResult:
    """What ``simulate_pipeline`` measured.

    Attributes:
        steps: trainer steps completed. unique_rollouts: rollouts generated (K_inf).
        samples_consumed: rollouts drawn, repeats counted (K_train; about steps x B, the
            step in progress at the end included).
        mean_replay_ratio: samples consumed / unique rollouts (section 2).
        expected_replay_ratio: mu T / W, the section-3 prediction for a buffer.
        compute_per_update: GPU time per step, (W + T) x wall time / steps, in units of C,
            measured after the warm-up (section 3: 1 + W/T with a buffer, 1 + mu ideal
            without one).
        trainer_idle_fraction, worker_idle_fraction: share of the post-warm-up wall time the
            trainers waited for data / the workers waited for room (LIFO queue only).
        warmup_time: wall time before the first step could start (C units).
        wall_time: time of the last insertion (C units).
        histograms: off_policiness, replay_ratio, steps_since_last_use ({value: count}).
        uses: per-use records (item_id, step, staleness, since_last_use; -1 = first use).
        replay_ratios: uses per rollout (rollouts still in the buffer included).
        counts: unique_rollouts, samples_consumed, workers, trainers, steps, mu_accounting
            (the ``ProbeSet.counts`` layout).
    """

    steps: int
    unique_rollouts: int
    samples_consumed: int
    mean_replay_ratio: float
    expected_replay_ratio: float
    compute_per_update: float
    trainer_idle_fraction: float
    worker_idle_fraction: float
    warmup_time: float
    wall_time: float
    histograms: dict
    uses: dict = field(repr=False)
    replay_ratios: np.ndarray = field(repr=False)
    counts: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """The scalar results as a JSON-ready dict."""
        return {k: getattr(self, k) for k in (
            "steps", "unique_rollouts", "samples_consumed", "mean_replay_ratio",
            "expected_replay_ratio", "compute_per_update", "trainer_idle_fraction",
            "worker_idle_fraction", "warmup_time", "wall_time")}


class _Durations:
    """Work durations, optionally jittered by a mean-one gamma factor (cv = jitter)."""

    def __init__(self, jitter: float, rng: np.random.Generator):
        self.jitter = jitter
        self.rng = rng

    def __call__(self, base: float) -> float:
        if self.jitter == 0:
            return base
        shape = 1.0 / self.jitter**2
        return base * float(self.rng.gamma(shape, 1.0 / shape))


def simulate_pipeline(*, workers: int, trainers: int, mu: float, batch_size: int,
                      buffer_size: int, rollouts: int, refresh_every: int = 1,
                      sharded: bool = True, lifo: bool = False,
                      sampling: str = "with_replacement", delta: float = 0.0,
                      positive_rate: float = 0.5, chunk: int | None = None,
                      min_fill: int | None = None, gen_jitter: float = 0.0,
                      train_jitter: float = 0.0, seed: int = 0) -> PipelineResult:
    """Simulate the asynchronous system of theory.md sections 1-2 until ``rollouts`` are made.

    Args:
        workers: W inference workers, integer >= 1.
        trainers: T trainers stepping together (data parallel), integer >= 1.
        mu: generation cost of one batch of B rollouts over one update C, in (0, inf).
        batch_size: B rollouts per step (all trainers together), integer >= 1; a multiple of
            T when ``sharded`` (each trainer draws B/T from its own shard).
        buffer_size: N, FIFO capacity (or LIFO queue capacity), integer >= B; a multiple of T
            when ``sharded``.
        rollouts: unique rollouts to generate before stopping, integer >= 1.
        refresh_every: k, trainer steps between weight publications, integer >= 1.
        sharded: one shard of N/T per trainer (new rollouts spread round robin) or one buffer.
        lifo: the no-buffer baseline (freshest first, each rollout used once, workers block
            while the queue is full) instead of the replay buffer.
        sampling: "with_replacement" (the theory), "without_replacement" (within a batch) or
            "never_used_first".
        delta: positive-bias coefficient in [0, 1) (0 = plain FIFO).
        positive_rate: probability in [0, 1] that a rollout is correct (reward > 0); only used
            with delta > 0.
        chunk: rollouts a worker makes per call, integer in [1, N]; default max(1, B // W).
        min_fill: rollouts every shard must hold before the first step (default B per shard,
            i.e. B/T sharded or B), integer >= 1.
        gen_jitter, train_jitter: coefficient of variation (>= 0) of generation and step
            durations (gamma distributed); 0 = deterministic.
        seed: seed of the random stream (sampling, rewards, jitter).

    Returns:
        ``PipelineResult``.
    """
    w = v.integer("workers", workers, 1)
    t = v.integer("trainers", trainers, 1)
    mu = v.positive("mu", mu)
    b = v.integer("batch_size", batch_size, 1)
    n = v.integer("buffer_size", buffer_size, b)
    total = v.integer("rollouts", rollouts, 1)
    k = v.integer("refresh_every", refresh_every, 1)
    sampling = v.choice("sampling", sampling, SAMPLING_MODES)
    delta = v.real("delta", delta, 0.0, 1.0, hi_open=True)
    p_pos = v.unit_interval("positive_rate", positive_rate)
    chunk = max(1, b // w) if chunk is None else v.integer("chunk", chunk, 1, n)
    gen_jitter = v.nonnegative("gen_jitter", gen_jitter)
    train_jitter = v.nonnegative("train_jitter", train_jitter)
    shards = t if sharded else 1
    if sharded and b % t:
        raise ValueError(f"batch_size must be a multiple of trainers ({t}) when sharded, "
                         f"got {b}")
    if sharded and n % t:
        raise ValueError(f"buffer_size must be a multiple of trainers ({t}) when sharded, "
                         f"got {n}")
    per_draw = b // shards
    fill = per_draw if min_fill is None else v.integer("min_fill", min_fill, 1, n // shards)
    if lifo and chunk > n:
        raise ValueError(f"chunk must be <= buffer_size ({n}) with the LIFO queue, got {chunk}")

    rng = np.random.default_rng(seed)
    buf = ReplayIndex(n, sampling=sampling, delta=delta, shards=shards, lifo=lifo)
    gen_time = _Durations(gen_jitter, rng)
    step_time = _Durations(train_jitter, rng)
    chunk_base, step_base = chunk * mu / b, 1.0 / t

    events: list[tuple[float, int, int, int]] = []
    seq = 0
    version = np.zeros(w, dtype=np.int64)
    blocked_since = np.full(w, np.nan)
    worker_idle = 0.0
    steps = published = made = 0
    in_flight = 0  # rollouts being generated (room is reserved for them in the LIFO queue)
    trainer_busy = False
    waiting_since = 0.0
    warmup_end = None
    trainer_idle = 0.0

    def push(when, kind, who):
        nonlocal seq
        heapq.heappush(events, (when, kind, seq, who))
        seq += 1

    def start_chunk(j, now):
        nonlocal worker_idle, in_flight
        if lifo and len(buf) + in_flight + chunk > n:
            if np.isnan(blocked_since[j]):
                blocked_since[j] = now
            return
        if not np.isnan(blocked_since[j]):
            if warmup_end is not None:
                worker_idle += now - max(blocked_since[j], warmup_end)
            blocked_since[j] = np.nan
        version[j] = published
        in_flight += chunk
        push(now + gen_time(chunk_base), _WORKER, j)

    def ready():
        return all(buf.size(s) >= fill and buf.can_sample(per_draw, s) for s in range(shards))

    def try_start_step(now):
        nonlocal trainer_busy, warmup_end, trainer_idle, fill
        if trainer_busy or not ready():
            return
        if warmup_end is None:
            warmup_end = now
            fill = 1  # the fill condition only delays the first step
        else:
            trainer_idle += now - waiting_since
        for s in range(shards):
            buf.sample(per_draw, steps, rng, shard=s)
        trainer_busy = True
        push(now + step_time(step_base), _TRAINER, 0)
        if lifo:  # the draw made room in the queue
            for j in np.flatnonzero(~np.isnan(blocked_since)):
                start_chunk(int(j), now)

    for j in range(w):
        start_chunk(j, 0.0)
    now = 0.0
    while made < total:
        now, kind, _, who = heapq.heappop(events)
        if kind == _WORKER:
            in_flight -= chunk
            size = min(chunk, total - made)
            ids = np.arange(made, made + size)
            positive = rng.random(size) < p_pos if delta > 0 else None
            target = None
            if lifo and shards > 1:  # keep the queue's shards level so none overflows
                sizes = np.array([buf.size(s) for s in range(shards)])
                target = np.empty(size, dtype=np.int64)
                for i in range(size):
                    target[i] = int(np.argmin(sizes))
                    sizes[target[i]] += 1
            buf.add(ids, int(version[who]), steps, positive=positive, shard=target)
            made += size
            try_start_step(now)
            if made < total:
                start_chunk(who, now)
        else:
            steps += 1
            if steps % k == 0:
                published = steps
            trainer_busy = False
            waiting_since = now
            try_start_step(now)

    window = now - (warmup_end if warmup_end is not None else now)
    if trainer_busy is False and warmup_end is not None:
        trainer_idle += now - waiting_since
    if warmup_end is not None:
        for j in np.flatnonzero(~np.isnan(blocked_since)):
            worker_idle += now - max(blocked_since[j], warmup_end)
    ratios = buf.replay_ratios(include_live=True)
    consumed = int(ratios.sum())  # every draw, the in-flight step's included
    counts = {"unique_rollouts": made, "samples_consumed": consumed, "workers": w,
              "trainers": t, "steps": steps, "mu_accounting": mu}
    return PipelineResult(
        steps=steps, unique_rollouts=made, samples_consumed=consumed,
        mean_replay_ratio=consumed / made,
        expected_replay_ratio=mu * t / w,
        compute_per_update=(w + t) * window / steps if steps else float("nan"),
        trainer_idle_fraction=trainer_idle / window if window > 0 else float("nan"),
        worker_idle_fraction=worker_idle / (w * window) if window > 0 else float("nan"),
        warmup_time=float(warmup_end) if warmup_end is not None else float("nan"),
        wall_time=now, histograms=buf.histograms(include_live=True),
        uses=buf.use_records(), replay_ratios=ratios, counts=counts)


__all__ = ["PipelineResult", "simulate_pipeline"]
