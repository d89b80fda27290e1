"""Replay-buffer semantics at the index level (theory.md sections 1-2), payload-agnostic.

One implementation of "which rollouts are in the buffer and which are drawn", shared by the
pipeline simulator (``pipeline_sim``) and the LLM harness (which keeps the token payloads in
its own store keyed by item id). numpy only.

* FIFO buffer of capacity N: always holds the N most recent rollouts; a batch is drawn
  uniformly without removing anything. Sampling modes: ``"with_replacement"`` (the theory),
  ``"without_replacement"`` (within a batch; the paper's pseudo-code) and
  ``"never_used_first"`` (unused items first, then without replacement).
* Group draws (``GROUP_MODES``, what most GRPO systems do): the buffer holds whole groups of
  G rollouts of one prompt (inserted whole, as G consecutive ids, and evicted whole) and a
  batch of B is B/G groups drawn uniformly, ``"groups_with_replacement"`` (a group may come
  twice in one batch: the model of theory.md section 11.9) or ``"groups_without_replacement"``
  (B/G distinct groups). The positive-bias part and the shards then hold whole groups too:
  a group counts as positive when any of its rollouts is, and goes to one shard.
* Positive-bias buffer, delta in [0, 1): keep the freshest (1 - delta) N rollouts plus the
  freshest delta N correct (positive) rollouts not already among them, sample from those.
* Sharding: ``shards`` = T independent shards of N/T each; each new rollout goes to exactly
  one shard (round robin unless given) and trainer k samples shard k only.
* LIFO queue (``lifo=True``), the no-buffer baseline: the freshest unused rollouts are served
  first and each rollout is used exactly once (removed when drawn).
* A horizon that grows (``horizon_growth`` g in (0, 1], theory.md section 11.13): at trainer
  step t a batch is drawn only from rollouts inserted in the last k(t) steps
  (``growing_window``); older ones are evicted before the draw. With g <= 1 the window's
  oldest step never moves back, so this is a FIFO whose capacity grows from one step of
  rollouts to ``max_horizon`` steps (and never beyond N).

Every use is recorded with the three axes of section 2: off-policiness (step minus generation
step), steps-since-last-use (``NEW = -1`` at first use), and per-rollout replay ratio (uses over
the whole run).
"""

from __future__ import annotations

import math

import numpy as np

from . import checks
from .columns import IdTable, IntRing

# Rollout by rollout, then whole groups (``GROUP_MODES``); the first is the default.
SAMPLING_MODES = ("with_replacement", "without_replacement", "never_used_first",
                  "groups_with_replacement", "groups_without_replacement")
GROUP_MODES = SAMPLING_MODES[3:]
# Modes that may draw an item (a group) twice in one batch: one item (group) held suffices.
REPLACING = ("with_replacement", "groups_with_replacement")
NEW = -1  # steps-since-last-use code of a first use
# Modes a growing horizon supports: a window of one step may hold fewer than B rollouts.
GROWING_MODES = REPLACING
# Metadata per held item, in the order of the checkpoint lists.
META_COLUMNS = {"generation_step": np.int64, "insert_step": np.int64, "uses": np.int32,
                "last_use": np.int64, "positive": np.bool_}


def positive_part(capacity: int, delta: float, group_size: int = 1) -> int:
    """Rollouts of a shard of ``capacity`` (>= 1) kept for positives at bias delta in [0, 1):
    round(delta N), in whole groups of ``group_size`` (>= 1; 1 when rollouts are drawn one by
    one). The rest, the recent part, is what a batch can always be drawn from."""
    return group_size * int(round(delta * capacity / group_size))


def check_growth(name: str, growth, *, sampling: str, delta: float, lifo: bool) -> float:
    """``growth`` (g, a growing horizon's slope in steps of window per trainer step) as a
    float in [0, 1], 0 = off, else raise ``ValueError`` naming ``name``. g > 0 needs a FIFO
    replay buffer (delta = 0, not the LIFO queue: a positive part or a queue has no window of
    recent steps) drawing with replacement (``GROWING_MODES``: the window of the first steps
    holds fewer than B rollouts)."""
    g = checks.real(name, growth, 0.0, 1.0)
    if g == 0:
        return g
    at = name[:name.rfind(".") + 1]  # the section of ``name``, for the other keys
    if lifo or delta > 0:
        raise ValueError(f"{name} > 0 (a growing horizon) needs the plain FIFO buffer, "
                         f"{at}delta = 0 and {at}lifo = false; got {at}delta={delta:g}, "
                         f"{at}lifo={lifo}")
    if sampling not in GROWING_MODES:
        raise ValueError(f"{name} > 0 (a growing horizon) needs {at}sampling in "
                         f"{list(GROWING_MODES)}: the window of the first steps holds fewer "
                         f"rollouts than a batch drawn without replacement; got {sampling}")
    return g


def growing_window(step: int, growth: float, max_horizon: float) -> int:
    """k(t) = floor(x(t)), x(t) = min(x_max, max(1, g (t + 1))) (theory.md section 11.13):
    the trainer steps (>= 1) whose rollouts a batch at step t (>= 0) may be drawn from, the
    steps t - k(t) + 1 .. t. ``growth`` g in (0, 1] (steps of window per step);
    ``max_horizon`` x_max >= 1 (steps; the fixed buffer's horizon). A rollout drawn at step t
    is at most k(t) - 1 <= x(t) - 1 steps old; k(t + 1) <= k(t) + 1 when g <= 1."""
    x = min(max_horizon, max(1.0, growth * (step + 1)))
    return int(math.floor(x + 1e-9))  # g (t + 1) = 29 must not floor to 28


class _Shard:
    """One shard: a FIFO window of recent items plus, with delta > 0, a FIFO of positives
    (each part a whole number of ``unit``-sized groups)."""

    def __init__(self, capacity: int, delta: float, unit: int):
        self.n_pos = positive_part(capacity, delta, unit)
        self.n_recent = capacity - self.n_pos
        self.recent = IntRing()
        self.positives = IntRing()

    def items(self) -> np.ndarray:
        return np.concatenate([self.recent.array(), self.positives.array()])

    def __len__(self) -> int:
        return len(self.recent) + len(self.positives)


class ReplayIndex:
    """Item ids and their metadata in a replay buffer; draws batches and records every use.

    Args:
        capacity: N, rollouts held in total (integer >= 1; divisible by ``shards``, and by
            ``shards`` x ``group_size`` with a group mode).
        sampling: one of ``SAMPLING_MODES`` (ignored with ``lifo``).
        delta: positive-bias coefficient in [0, 1); 0 is the plain FIFO buffer.
        shards: number of shards T >= 1 (one per trainer).
        lifo: the no-buffer baseline queue instead of a replay buffer.
        group_size: G >= 1, rollouts per group; used by the group modes only.
        horizon_growth: g in [0, 1], 0 = off (``check_growth``); g > 0: a batch at step t
            is drawn from the rollouts inserted in the last ``growing_window`` steps only
            (older ones are evicted first), and rollouts must be inserted in step order.
        max_horizon: x_max >= 1, the growing window's largest size in steps (the capacity
            N still bounds what is held); None = no bound but N. Used only when
            horizon_growth > 0.
    """

    def __init__(self, capacity: int, *, sampling: str = "with_replacement",
                 delta: float = 0.0, shards: int = 1, lifo: bool = False,
                 group_size: int = 1, horizon_growth: float = 0.0,
                 max_horizon: float | None = None):
        self.capacity = checks.integer("capacity", capacity, 1)
        self.sampling = checks.choice("sampling", sampling, SAMPLING_MODES)
        self.delta = checks.real("delta", delta, 0.0, 1.0, hi_open=True)
        self.shards = checks.integer("shards", shards, 1, self.capacity)
        self.group_size = checks.integer("group_size", group_size, 1)
        if self.capacity % self.shards:
            raise ValueError(f"capacity must be divisible by shards ({self.shards}), "
                             f"got {self.capacity}")
        if lifo and self.delta > 0:
            raise ValueError("delta must be 0 for the LIFO queue (no replay)")
        self.lifo = bool(lifo)
        self.horizon_growth = check_growth("horizon_growth", horizon_growth,
                                           sampling=self.sampling, delta=self.delta,
                                           lifo=self.lifo)
        self.max_horizon = math.inf if max_horizon is None else \
            checks.real("max_horizon", max_horizon, 1.0)
        self._newest_insert = -1  # insert steps must not decrease with a growing horizon
        # Rollouts per unit of insertion, eviction and draw: G with group draws, else 1.
        self.unit = self.group_size if self.sampling in GROUP_MODES and not self.lifo else 1
        if self.capacity % (self.shards * self.unit):
            raise ValueError(f"capacity must be a multiple of shards x group_size "
                             f"({self.shards} x {self.unit}) with sampling={self.sampling}: "
                             f"every shard holds whole groups; got {self.capacity}")
        self._shards = [_Shard(self.capacity // self.shards, self.delta, self.unit)
                        for _ in range(self.shards)]
        # Per held item, as numpy columns (a dict of lists would cost ~250 bytes an item).
        self._meta = IdTable(META_COLUMNS)
        self._next_shard = 0
        self._uses: list[np.ndarray] = []  # per sample() call: (id, step, staleness, since_last)
        # Use counts of the rollouts that left the buffer, as a histogram: index = uses.
        self._final_uses = np.zeros(1, dtype=np.int64)

    # ---- contents ----------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(len(s) for s in self._shards)

    def size(self, shard: int = 0) -> int:
        """Items held by one shard."""
        return len(self._shards[checks.integer("shard", shard, 0, self.shards - 1)])

    def items(self, shard: int | None = None) -> np.ndarray:
        """Ids currently held (one shard, or all), oldest recent first, then positives."""
        if shard is None:
            return np.concatenate([s.items() for s in self._shards])
        return self._shards[checks.integer("shard", shard, 0, self.shards - 1)].items()

    def metadata(self, ids) -> dict[str, np.ndarray]:
        """generation_step, insert_step, uses, last_use (-1 never) and positive, per id."""
        rows = self._meta.rows(np.atleast_1d(ids))
        return {k: c[rows].astype(bool if k == "positive" else np.int64)
                for k, c in self._meta.cols.items()}

    def _leave(self, ids) -> None:
        """Drop ``ids`` from the metadata, keeping their final use counts."""
        rows = self._meta.delete(ids)
        uses = self._meta.cols["uses"][rows]
        if uses.size and uses.max() >= self._final_uses.size:
            self._final_uses = np.pad(self._final_uses, (0, uses.max() + 1 -
                                                         self._final_uses.size))
        np.add.at(self._final_uses, uses, 1)

    # ---- producer side -----------------------------------------------------------------

    def add(self, item_ids, generation_step, insert_step, positive=None,
            shard=None, group=None) -> np.ndarray:
        """Insert rollouts; returns the ids evicted (they leave the buffer for good).

        Args:
            item_ids: unique integer ids (array); with a group mode whole groups, each as
                ``group_size`` consecutive ids. generation_step: policy version that
                generated each (scalar or array). insert_step: trainer step at insertion.
            positive: per-item bool (reward > 0), needed when delta > 0; with a group mode a
                group is positive when any of its rollouts is.
            shard: target shard (scalar or array; one per group with a group mode); round
                robin over shards (by group with a group mode) if None.
            group: per-item group key (array), checked against the layout above with a group
                mode; ignored otherwise.
        """
        ids = np.atleast_1d(np.asarray(item_ids, dtype=np.int64))
        n = ids.size
        gen = np.broadcast_to(np.asarray(generation_step, dtype=np.int64), (n,))
        ins = np.broadcast_to(np.asarray(insert_step, dtype=np.int64), (n,))
        if positive is None:
            if self.delta > 0:
                raise ValueError("positive (reward > 0 per item) is required when delta > 0")
            pos = np.zeros(n, dtype=bool)
        else:
            pos = np.broadcast_to(np.asarray(positive, dtype=bool), (n,))
        target = self._targets(n, shard, group)
        if self.horizon_growth > 0 and n:
            # ``expire`` pops the oldest insertions first: they must be the oldest steps.
            if ins.min() < self._newest_insert or np.any(np.diff(ins) < 0):
                raise ValueError(f"insert_step must not decrease with horizon_growth > 0; "
                                 f"got {int(ins.min())} after {self._newest_insert}")
            self._newest_insert = int(ins.max())
        if self.unit > 1:  # groups move between the parts whole
            pos = np.repeat(pos.reshape(-1, self.unit).any(1), self.unit)
        held = self._meta.contains(ids)
        if np.any(held) or np.unique(ids).size < n:
            srt = np.sort(ids)
            key = int(ids[held][0]) if np.any(held) else int(srt[1:][np.diff(srt) == 0][0])
            raise ValueError(f"item id {key} is already in the buffer (ids must be unique)")
        self._meta.insert(ids, generation_step=gen, insert_step=ins, uses=0, last_use=NEW,
                          positive=pos)
        evicted = []
        for i in range(n):
            key = int(ids[i])
            sh = self._shards[int(target[i])]
            sh.recent.append(key)
            if self.lifo:
                if len(sh.recent) > sh.n_recent:
                    evicted.append(sh.recent.popleft())
                continue
            if len(sh.recent) > sh.n_recent:
                old = sh.recent.popleft()
                if sh.n_pos > 0 and bool(self._meta.cols["positive"][self._meta.rows(old)]):
                    sh.positives.append(old)
                    if len(sh.positives) > sh.n_pos:
                        evicted.append(sh.positives.popleft())
                else:
                    evicted.append(old)
        evicted = np.asarray(evicted, dtype=np.int64)
        self._leave(evicted)
        return evicted

    def _targets(self, n: int, shard, group) -> np.ndarray:
        """Shard of each of ``n`` new items: ``shard`` (scalar or array), else round robin
        by unit (one group goes to one shard); checks a group mode's whole-group layout."""
        u = self.unit
        if n % u:
            raise ValueError(f"sampling={self.sampling} inserts whole groups: the number of "
                             f"ids ({n}) must be a multiple of group_size ({u})")
        if u > 1 and group is not None:
            keys = np.asarray(group).reshape(-1, u)
            if np.any(keys != keys[:, :1]) or np.unique(keys[:, 0]).size < len(keys):
                raise ValueError(f"group must give each group as {u} consecutive ids of one "
                                 f"key (group_size), one block per group, with "
                                 f"sampling={self.sampling}")
        if shard is None:
            target = np.repeat((self._next_shard + np.arange(n // u)) % self.shards, u)
            self._next_shard = int((self._next_shard + n // u) % self.shards)
            return target
        target = np.broadcast_to(np.asarray(shard, dtype=np.int64), (n,))
        if np.any((target < 0) | (target >= self.shards)):
            raise ValueError(f"shard must be in [0, {self.shards - 1}]")
        if u > 1 and np.any(target.reshape(-1, u) != target.reshape(-1, u)[:, :1]):
            raise ValueError(f"shard must send each group of {u} (group_size) to one shard")
        return target

    # ---- consumer side -----------------------------------------------------------------

    def can_sample(self, batch_size: int, shard: int = 0) -> bool:
        """Whether ``sample`` can draw a batch now: without replacement needs B items (B/G
        groups), with replacement one item (one group). Raises ``ValueError`` when a group
        mode's batch_size is not a multiple of group_size G."""
        n = self.size(shard)
        if self.unit > 1 and batch_size % self.unit:
            raise ValueError(f"batch_size ({batch_size}) must be a multiple of group_size "
                             f"({self.unit}) with sampling={self.sampling}: a batch is "
                             f"batch_size / group_size whole groups")
        if self.lifo or self.sampling not in REPLACING:
            return n >= batch_size
        return n >= self.unit

    def expire(self, step: int) -> np.ndarray:
        """With a growing horizon, evict every rollout inserted before the window of trainer
        step ``step`` (``growing_window``) and return their ids (empty when off). ``sample``
        calls it first; a payload store calls it to learn which payloads to drop."""
        if self.horizon_growth == 0:
            return np.zeros(0, dtype=np.int64)
        oldest = step - growing_window(step, self.horizon_growth, self.max_horizon) + 1
        inserted = self._meta.cols["insert_step"]
        gone = []
        for sh in self._shards:
            while len(sh.recent) and inserted[self._meta.rows(sh.recent.peekleft())] < oldest:
                gone.append(sh.recent.popleft())
        gone = np.asarray(gone, dtype=np.int64)
        self._leave(gone)
        return gone

    def drop(self, ids) -> np.ndarray:
        """Evict the held ``ids`` now, whatever their age (the adaptive horizon drops
        rollouts whose staleness statistic passed its threshold); returns those that were
        held. Their use counts are kept as final."""
        gone = [ring.discard(ids) for sh in self._shards for ring in (sh.recent, sh.positives)]
        gone = np.concatenate(gone) if gone else np.zeros(0, dtype=np.int64)
        self._leave(gone)
        return gone

    def sample(self, batch_size: int, step: int, rng: np.random.Generator,
               shard: int = 0) -> np.ndarray:
        """Draw a batch of ids for trainer step ``step`` and record each use (with a growing
        horizon, after ``expire(step)``).

        Raises ``ValueError`` if the shard holds too few items (see ``can_sample``).
        """
        b = checks.integer("batch_size", batch_size, 1)
        shard = checks.integer("shard", shard, 0, self.shards - 1)
        self.expire(step)
        if not self.can_sample(b, shard):
            unit = f" in groups of {self.unit}" if self.unit > 1 else ""
            raise ValueError(f"batch_size ({b}) exceeds the items available{unit} in shard "
                             f"{shard} ({self.size(shard)})")
        sh = self._shards[shard]
        if self.lifo:
            chosen = np.array([sh.recent.pop() for _ in range(b)], dtype=np.int64)
        elif self.sampling in GROUP_MODES:
            chosen = self._draw_groups(sh.items(), b // self.unit, rng)
        else:
            pool = sh.items()
            if self.sampling == "with_replacement":
                chosen = pool[rng.integers(0, pool.size, b)]
            elif self.sampling == "without_replacement":
                chosen = pool[rng.choice(pool.size, b, replace=False)]
            else:
                unused = self._meta.cols["uses"][self._meta.rows(pool)] == 0
                fresh, used = pool[unused], pool[~unused]
                if fresh.size >= b:
                    chosen = fresh[rng.choice(fresh.size, b, replace=False)]
                else:
                    rest = used[rng.choice(used.size, b - fresh.size, replace=False)]
                    chosen = np.concatenate([rng.permutation(fresh), rest])
        cols, rows = self._meta.cols, self._meta.rows(chosen)
        last = cols["last_use"][rows]
        # A rollout drawn twice in one batch: its later draws come 0 steps after the first.
        first = np.zeros(b, dtype=bool)
        first[np.unique(rows, return_index=True)[1]] = True
        since = np.where(first, np.where(last == NEW, NEW, step - last), 0)
        rec = np.stack([chosen, np.full(b, step), step - cols["generation_step"][rows], since],
                       1).astype(np.int64)
        np.add.at(cols["uses"], rows, 1)
        cols["last_use"][rows] = step
        if self.lifo:
            self._leave(chosen)
        self._uses.append(rec)
        return chosen

    def _draw_groups(self, pool: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
        """``k`` whole groups of ``pool`` (held ids, whole groups of G in insertion order),
        uniformly with or without replacement by the sampling mode; their ids, group by group."""
        groups = pool.reshape(-1, self.unit)
        if self.sampling == "groups_with_replacement":
            rows = rng.integers(0, len(groups), k)
        else:
            rows = rng.choice(len(groups), k, replace=False)
        return groups[rows].ravel()

    # ---- the three axes ----------------------------------------------------------------

    def use_records(self, last_calls: int | None = None) -> dict[str, np.ndarray]:
        """Every recorded use: item_id, step, staleness (off-policiness), since_last_use.

        ``last_calls``: only the uses of the last that many ``sample`` calls (a per-step view
        that does not cost a pass over the whole history); None = all.
        """
        parts = self._uses if last_calls is None else \
            self._uses[max(0, len(self._uses) - checks.integer("last_calls", last_calls, 0)):]
        rec = np.concatenate(parts) if parts else np.zeros((0, 4), dtype=np.int64)
        return {"item_id": rec[:, 0], "step": rec[:, 1], "staleness": rec[:, 2],
                "since_last_use": rec[:, 3]}

    def replay_ratios(self, include_live: bool = True) -> np.ndarray:
        """Uses per rollout: final counts of rollouts that left (in increasing order), plus
        (if asked) those of the rollouts held."""
        gone = np.repeat(np.arange(self._final_uses.size), self._final_uses)
        if not include_live:
            return gone
        return np.concatenate([gone, self._meta.cols["uses"][self._meta.live_rows()]
                               .astype(np.int64)])

    def replay_ratio_quantiles(self, qs, include_live: bool = True) -> np.ndarray:
        """Quantiles ``qs`` in [0, 1] of ``replay_ratios(include_live)`` (numpy's linear
        interpolation), from the use-count histogram: O(max uses + N), not O(all rollouts),
        so a per-step log stays cheap in long runs. NaN when no rollout is counted."""
        counts = self._final_uses.copy()
        if include_live:
            live = self._meta.cols["uses"][self._meta.live_rows()].astype(np.int64)
            live_counts = np.bincount(live, minlength=counts.size)
            counts = np.pad(counts, (0, live_counts.size - counts.size)) + live_counts
        n = int(counts.sum())
        qs = np.asarray(qs, dtype=float)
        if n == 0:
            return np.full(qs.shape, np.nan)
        cum = np.cumsum(counts)
        h = (n - 1) * qs
        lo, hi = np.floor(h).astype(np.int64), np.ceil(h).astype(np.int64)
        # The i-th smallest value (from 0) is the first v whose cumulative count exceeds i.
        a_lo, a_hi = np.searchsorted(cum, lo, side="right"), np.searchsorted(cum, hi, side="right")
        return a_lo + (h - lo) * (a_hi - a_lo)

    def histograms(self, include_live: bool = True) -> dict[str, dict]:
        """The three histograms of section 2 as {value: count} dicts.

        ``off_policiness`` over uses, ``replay_ratio`` over rollouts (0 = never used),
        ``steps_since_last_use`` over uses with the key "new" for first uses.
        """
        rec = self.use_records()

        def counts(a):
            vals, cnt = np.unique(a, return_counts=True)
            return {int(x): int(c) for x, c in zip(vals, cnt)}

        since = counts(rec["since_last_use"])
        since = {("new" if k == NEW else k): c for k, c in since.items()}
        return {"off_policiness": counts(rec["staleness"]),
                "replay_ratio": counts(self.replay_ratios(include_live)),
                "steps_since_last_use": since}

    def mean_replay_ratio(self, include_live: bool = True) -> float:
        """Samples consumed / unique rollouts (section 2)."""
        r = self.replay_ratios(include_live)
        return float(r.mean()) if r.size else 0.0

    # ---- checkpointing -----------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything needed to resume, as plain Python/numpy objects."""
        rows = self._meta.live_rows()
        return {"capacity": self.capacity, "sampling": self.sampling, "delta": self.delta,
                "shards": self.shards, "lifo": self.lifo, "group_size": self.group_size,
                "horizon_growth": self.horizon_growth,
                "max_horizon": None if math.isinf(self.max_horizon) else self.max_horizon,
                "next_shard": self._next_shard,
                "recent": [s.recent.array().tolist() for s in self._shards],
                "positives": [s.positives.array().tolist() for s in self._shards],
                "meta": {int(i): [int(x) for x in m] for i, m in zip(
                    self._meta.ids[rows], zip(*(self._meta.cols[k][rows] for k in META_COLUMNS)))},
                "uses": self.use_records(), "final_uses": self.replay_ratios(False).tolist()}

    @classmethod
    def from_state_dict(cls, state: dict) -> "ReplayIndex":
        """Rebuild a buffer saved with ``state_dict``."""
        buf = cls(state["capacity"], sampling=state["sampling"], delta=state["delta"],
                  shards=state["shards"], lifo=state["lifo"],
                  group_size=state.get("group_size", 1),  # checkpoints before group draws
                  horizon_growth=state.get("horizon_growth", 0.0),  # before growing horizons
                  max_horizon=state.get("max_horizon"))
        buf._next_shard = int(state["next_shard"])
        for sh, rec, pos in zip(buf._shards, state["recent"], state["positives"]):
            sh.recent, sh.positives = IntRing(rec), IntRing(pos)
        meta = sorted((int(k), m) for k, m in state["meta"].items())
        if meta:
            values = np.array([m for _, m in meta], dtype=np.int64).reshape(-1, 5)
            buf._meta.insert([k for k, _ in meta],
                             **{k: values[:, j] for j, k in enumerate(META_COLUMNS)})
            buf._newest_insert = int(values[:, list(META_COLUMNS).index("insert_step")].max())
        u = state["uses"]
        if len(u["item_id"]):
            buf._uses = [np.stack([np.asarray(u[k], dtype=np.int64) for k in
                                   ("item_id", "step", "staleness", "since_last_use")], 1)]
        final = np.asarray(state["final_uses"], dtype=np.int64)
        buf._final_uses = np.bincount(final, minlength=1) if final.size else \
            np.zeros(1, dtype=np.int64)
        return buf


def sync_fifo_slots(step: int, rollouts_per_step: int, capacity) -> np.ndarray:
    """Ring slots that receive the R rollouts of ``step`` in the synchronous FIFO (section 4).

    A FIFO of capacity N fed R <= N rollouts per step is a ring: the j-th rollout of step t
    goes to slot (t R + j) mod N, overwriting the oldest one, so the slots hold exactly what
    ``ReplayIndex(N)`` holds after the same ``add`` calls. Vectorised over ``capacity`` (one
    N per simulated run) for the synchronous simulator (``replay_sim``).

    Args:
        step: t >= 0. rollouts_per_step: R >= 1. capacity: N per run (array of ints >= R).
    Returns:
        int array of shape (len(capacity), R).
    """
    r = checks.integer("rollouts_per_step", rollouts_per_step, 1)
    caps = np.atleast_1d(np.asarray(capacity, dtype=np.int64))
    if np.any(caps < r):
        raise ValueError(f"capacity must be >= rollouts_per_step ({r}) in every run, "
                         f"got {int(caps.min())}")
    first = checks.integer("step", step, 0) * r
    return (first + np.arange(r, dtype=np.int64))[None, :] % caps[:, None]
