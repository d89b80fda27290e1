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

from .. import checks
from ..buffer import GROUP_MODES, SAMPLING_MODES, ReplayIndex

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


@dataclass(frozen=True)
class _Config:
    """Checked arguments of ``simulate_pipeline`` (names as in its docstring)."""

    w: int
    t: int
    mu: float
    b: int
    n: int
    total: int
    k: int
    sampling: str
    delta: float
    p_pos: float
    chunk: int
    fill: int
    shards: int
    lifo: bool
    gen_jitter: float
    train_jitter: float
    g: int

    @property
    def per_draw(self) -> int:
        """Rollouts each shard gives to one step."""
        return self.b // self.shards

    @classmethod
    def checked(cls, *, workers, trainers, mu, batch_size, buffer_size, rollouts,
                refresh_every, sharded, lifo, sampling, delta, positive_rate, chunk, min_fill,
                gen_jitter, train_jitter, group_size=1) -> _Config:
        """``simulate_pipeline``'s arguments (same names) checked against the ranges of its
        docstring."""
        w = checks.integer("workers", workers, 1)
        t = checks.integer("trainers", trainers, 1)
        b = checks.integer("batch_size", batch_size, 1)
        n = checks.integer("buffer_size", buffer_size, b)
        shards = t if sharded else 1
        if sharded and b % t:
            raise ValueError(f"batch_size must be a multiple of trainers ({t}) when "
                             f"sharded, got {b}")
        if sharded and n % t:
            raise ValueError(f"buffer_size must be a multiple of trainers ({t}) when "
                             f"sharded, got {n}")
        chunk = max(1, b // w) if chunk is None else checks.integer("chunk", chunk, 1, n)
        if lifo and chunk > n:
            raise ValueError(f"chunk must be <= buffer_size ({n}) with the LIFO queue, "
                             f"got {chunk}")
        g = checks.integer("group_size", group_size, 1)
        if not lifo and checks.choice("sampling", sampling, SAMPLING_MODES) in GROUP_MODES:
            _check_whole_groups(g, shards, b=b, n=n, chunk=chunk,
                                rollouts=checks.integer("rollouts", rollouts, 1))
        return cls(
            w=w, t=t, mu=checks.positive("mu", mu), b=b, n=n,
            total=checks.integer("rollouts", rollouts, 1),
            k=checks.integer("refresh_every", refresh_every, 1),
            sampling=checks.choice("sampling", sampling, SAMPLING_MODES),
            delta=checks.real("delta", delta, 0.0, 1.0, hi_open=True),
            p_pos=checks.unit_interval("positive_rate", positive_rate), chunk=chunk,
            fill=b // shards if min_fill is None
            else checks.integer("min_fill", min_fill, 1, n // shards),
            shards=shards, lifo=lifo, gen_jitter=checks.nonnegative("gen_jitter", gen_jitter),
            train_jitter=checks.nonnegative("train_jitter", train_jitter), g=g)


def _check_whole_groups(g: int, shards: int, **sizes) -> None:
    """A group sampling mode draws B / (shards G) whole groups per shard from shards of whole
    groups, and the workers make whole groups: each size (batch_size b, buffer_size n,
    chunk, rollouts) a multiple of G, b and n of shards x G."""
    for name, value in sizes.items():
        unit = g * shards if name in ("b", "n") else g
        if value % unit:
            key = {"b": "batch_size", "n": "buffer_size"}.get(name, name)
            raise ValueError(f"{key} must be a multiple of group_size ({g})"
                             f"{f' x shards ({shards})' if unit > g else ''} with a group "
                             f"sampling mode, got {value}")


@dataclass
class _State:
    """What changes during one simulation; times in C units (module docstring)."""

    cfg: _Config
    rng: np.random.Generator
    buf: ReplayIndex
    gen_time: _Durations
    step_time: _Durations
    fill: int  # rollouts per shard before a step may start; 1 after the first step
    events: list = field(default_factory=list)  # heap of (time, kind, seq, worker)
    seq: int = 0  # insertion counter: breaks ties between events at equal times and kinds
    version: np.ndarray = None  # weights version each worker generates with
    blocked_since: np.ndarray = None  # when each worker started waiting for room (nan: not)
    in_flight: int = 0  # rollouts being generated (room is reserved for them in the queue)
    made: int = 0
    steps: int = 0
    published: int = 0
    trainer_busy: bool = False
    waiting_since: float = 0.0  # when the trainers last finished a step
    warmup_end: float | None = None  # when the first step started
    trainer_idle: float = 0.0
    worker_idle: float = 0.0


def _new_state(cfg: _Config, seed) -> _State:
    rng = np.random.default_rng(seed)
    return _State(cfg=cfg, rng=rng,
                  buf=ReplayIndex(cfg.n, sampling=cfg.sampling, delta=cfg.delta,
                                  shards=cfg.shards, lifo=cfg.lifo, group_size=cfg.g),
                  gen_time=_Durations(cfg.gen_jitter, rng),
                  step_time=_Durations(cfg.train_jitter, rng), fill=cfg.fill,
                  version=np.zeros(cfg.w, dtype=np.int64),
                  blocked_since=np.full(cfg.w, np.nan))


def _push(st: _State, when: float, kind: int, who: int) -> None:
    heapq.heappush(st.events, (when, kind, st.seq, who))
    st.seq += 1


def _start_chunk(st: _State, j: int, now: float) -> None:
    """Worker j starts a chunk with the latest weights, or blocks while the queue is full."""
    cfg = st.cfg
    if cfg.lifo and len(st.buf) + st.in_flight + cfg.chunk > cfg.n:
        if np.isnan(st.blocked_since[j]):
            st.blocked_since[j] = now
        return
    if not np.isnan(st.blocked_since[j]):
        if st.warmup_end is not None:  # waiting during the warm-up is not idleness
            st.worker_idle += now - max(st.blocked_since[j], st.warmup_end)
        st.blocked_since[j] = np.nan
    st.version[j] = st.published
    st.in_flight += cfg.chunk
    _push(st, now + st.gen_time(cfg.chunk * cfg.mu / cfg.b), _WORKER, j)


def _ready(st: _State) -> bool:
    per_draw = st.cfg.per_draw
    return all(st.buf.size(s) >= st.fill and st.buf.can_sample(per_draw, s)
               for s in range(st.cfg.shards))


def _try_start_step(st: _State, now: float) -> None:
    """Start a step if the trainers are free and every shard can give its share."""
    cfg = st.cfg
    if st.trainer_busy or not _ready(st):
        return
    if st.warmup_end is None:
        st.warmup_end = now
        st.fill = 1  # the fill condition only delays the first step
    else:
        st.trainer_idle += now - st.waiting_since
    for s in range(cfg.shards):
        st.buf.sample(cfg.per_draw, st.steps, st.rng, shard=s)
    st.trainer_busy = True
    _push(st, now + st.step_time(1.0 / cfg.t), _TRAINER, 0)
    if cfg.lifo:  # the draw made room in the queue
        for j in np.flatnonzero(~np.isnan(st.blocked_since)):
            _start_chunk(st, int(j), now)


def _level_targets(st: _State, size: int) -> np.ndarray:
    """Shards for ``size`` new rollouts that keep the LIFO queue's shards level, so none
    overflows."""
    sizes = np.array([st.buf.size(s) for s in range(st.cfg.shards)])
    target = np.empty(size, dtype=np.int64)
    for i in range(size):
        target[i] = int(np.argmin(sizes))
        sizes[target[i]] += 1
    return target


def _chunk_done(st: _State, who: int, now: float) -> None:
    """Worker ``who`` inserts its chunk (cut at the rollout budget) and starts the next."""
    cfg = st.cfg
    st.in_flight -= cfg.chunk
    size = min(cfg.chunk, cfg.total - st.made)
    ids = np.arange(st.made, st.made + size)
    positive = st.rng.random(size) < cfg.p_pos if cfg.delta > 0 else None
    target = _level_targets(st, size) if cfg.lifo and cfg.shards > 1 else None
    st.buf.add(ids, int(st.version[who]), st.steps, positive=positive, shard=target)
    st.made += size
    _try_start_step(st, now)
    if st.made < cfg.total:
        _start_chunk(st, who, now)


def _step_done(st: _State, now: float) -> None:
    """The trainers finish a step, publish every k steps, and start the next if they can."""
    st.steps += 1
    if st.steps % st.cfg.k == 0:
        st.published = st.steps
    st.trainer_busy = False
    st.waiting_since = now
    _try_start_step(st, now)


def _result(st: _State, now: float) -> PipelineResult:
    """Close the idle-time accounts at ``now`` and collect the measurements."""
    cfg = st.cfg
    window = now - (st.warmup_end if st.warmup_end is not None else now)
    if st.trainer_busy is False and st.warmup_end is not None:
        st.trainer_idle += now - st.waiting_since
    if st.warmup_end is not None:
        for j in np.flatnonzero(~np.isnan(st.blocked_since)):
            st.worker_idle += now - max(st.blocked_since[j], st.warmup_end)
    ratios = st.buf.replay_ratios(include_live=True)
    consumed = int(ratios.sum())  # every draw, the in-flight step's included
    counts = {"unique_rollouts": st.made, "samples_consumed": consumed, "workers": cfg.w,
              "trainers": cfg.t, "steps": st.steps, "mu_accounting": cfg.mu}
    return PipelineResult(
        steps=st.steps, unique_rollouts=st.made, samples_consumed=consumed,
        mean_replay_ratio=consumed / st.made,
        expected_replay_ratio=cfg.mu * cfg.t / cfg.w,
        compute_per_update=((cfg.w + cfg.t) * window / st.steps if st.steps
                            else float("nan")),
        trainer_idle_fraction=st.trainer_idle / window if window > 0 else float("nan"),
        worker_idle_fraction=(st.worker_idle / (cfg.w * window) if window > 0
                              else float("nan")),
        warmup_time=float(st.warmup_end) if st.warmup_end is not None else float("nan"),
        wall_time=now, histograms=st.buf.histograms(include_live=True),
        uses=st.buf.use_records(), replay_ratios=ratios, counts=counts)


def simulate_pipeline(*, workers: int, trainers: int, mu: float, batch_size: int,
                      buffer_size: int, rollouts: int, refresh_every: int = 1,
                      sharded: bool = True, lifo: bool = False,
                      sampling: str = "with_replacement", delta: float = 0.0,
                      positive_rate: float = 0.5, chunk: int | None = None,
                      min_fill: int | None = None, gen_jitter: float = 0.0,
                      train_jitter: float = 0.0, seed: int = 0,
                      group_size: int = 1) -> PipelineResult:
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
        sampling: "with_replacement" (the theory), "without_replacement" (within a batch),
            "never_used_first", or whole groups of ``group_size``, "groups_with_replacement"
            (section 11.9's model) or "groups_without_replacement" (``buffer.SAMPLING_MODES``).
        delta: positive-bias coefficient in [0, 1) (0 = plain FIFO).
        positive_rate: probability in [0, 1] that a rollout is correct (reward > 0); only used
            with delta > 0.
        chunk: rollouts a worker makes per call, integer in [1, N]; default max(1, B // W).
        min_fill: rollouts every shard must hold before the first step (default B per shard,
            i.e. B/T sharded or B), integer >= 1.
        gen_jitter, train_jitter: coefficient of variation (>= 0) of generation and step
            durations (gamma distributed); 0 = deterministic.
        seed: seed of the random stream (sampling, rewards, jitter).
        group_size: G >= 1, rollouts per prompt group; with a group sampling mode (not the
            LIFO queue) a worker's chunk is whole groups (consecutive ids), and batch_size and
            buffer_size must be multiples of G (x T when sharded), chunk and rollouts of G.

    Returns:
        ``PipelineResult``.
    """
    cfg = _Config.checked(workers=workers, trainers=trainers, mu=mu, batch_size=batch_size,
                          buffer_size=buffer_size, rollouts=rollouts,
                          refresh_every=refresh_every, sharded=sharded, lifo=lifo,
                          sampling=sampling, delta=delta, positive_rate=positive_rate,
                          chunk=chunk, min_fill=min_fill, gen_jitter=gen_jitter,
                          train_jitter=train_jitter, group_size=group_size)
    st = _new_state(cfg, seed)
    for j in range(cfg.w):
        _start_chunk(st, j, 0.0)
    now = 0.0
    while st.made < cfg.total:
        now, kind, _, who = heapq.heappop(st.events)
        if kind == _WORKER:
            _chunk_done(st, who, now)
        else:
            _step_done(st, now)
    return _result(st, now)


__all__ = ["PipelineResult", "simulate_pipeline"]
