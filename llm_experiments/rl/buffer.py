"""Rollout payloads around ``replaytheory.buffer.ReplayIndex`` (theory.md sections 1-2).

``ReplayIndex`` decides which rollouts are held and drawn (FIFO capacity N, sampling modes,
positive bias delta, one shard per trainer, the LIFO no-buffer queue) and records every use.
This module keeps what the trainer needs of each rollout, compactly (int32 token ids, float32
behaviour log-probs, the advantage computed once at generation, in numpy columns: no Python
object per rollout), in a store keyed by item id, and drops a payload as soon as the index
evicts (or, for LIFO, consumes) it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from replaytheory.buffer import NEW, ReplayIndex
from replaytheory.columns import SLACK, IdTable

from .rates import buffer_shards, rollouts_per_step


@dataclass
class Rollout:
    """Message sampler -> buffer -> trainer: one sequence and what its loss needs.

    version: trainer step of the weights that generated it. prompt, completion: int32 ids
    (completion includes the first end-of-sequence). logprobs: float32 behaviour log-probs of
    the completion tokens. reward in [0, 1]; advantage: computed once, at generation, from the
    rewards of its group (``losses.group_advantages``).
    """

    item_id: int
    group_id: int
    problem_id: int
    version: int
    prompt: np.ndarray
    completion: np.ndarray
    logprobs: np.ndarray
    reward: float
    advantage: float


@dataclass(frozen=True)
class HeldRollouts:
    """Every rollout a buffer holds with its index metadata, as one plain record (what the
    gradient probes read of the buffer; a buffer in another process sends it as a message).

    rollouts: in increasing item id order. insert_step: trainer step at which each was
    inserted (int64, >= 0). uses: trainer draws of each so far (int64, >= 0).
    """

    rollouts: list[Rollout]
    insert_step: np.ndarray
    uses: np.ndarray


# Scalars of a rollout, and where its token ids and log-probs lie in the two arenas.
PAYLOAD_COLUMNS = {"group_id": np.int64, "problem_id": np.int64, "version": np.int64,
                   "reward": np.float64, "advantage": np.float64, "tokens_at": np.int64,
                   "logprobs_at": np.int64, "prompt_len": np.int32, "completion_len": np.int32}


class _Arena:
    """Variable-length rows of one dtype back to back in one array, appended at the end;
    space of dropped rows is reclaimed when the array is reallocated."""

    def __init__(self, dtype):
        self.data = np.empty(64, dtype=dtype)
        self.end = 0

    def append(self, flat: np.ndarray) -> int:
        """Store ``flat`` (room must have been made); returns its start."""
        start = self.end
        self.data[start:start + flat.size] = flat
        self.end += flat.size
        return start

    def repack(self, starts: np.ndarray, lengths: np.ndarray, extra: int) -> np.ndarray:
        """Copy the rows (starts, lengths) to a new array with room for ``extra`` more
        (``SLACK`` slack); returns their new starts."""
        total = int(lengths.sum())
        new_starts = np.cumsum(lengths) - lengths
        source = np.repeat(starts - new_starts, lengths) + np.arange(total)
        data = np.empty(max(64, int(SLACK * (total + extra))), dtype=self.data.dtype)
        data[:total] = self.data[source]
        self.data, self.end = data, total
        return new_starts


class RolloutBuffer:
    """A replay buffer of ``Rollout`` payloads (semantics: ``ReplayIndex``).

    Payloads are stored in columns, not as objects: the scalars in an ``IdTable`` keyed by
    item id, the token ids (prompt then completion) and behaviour log-probs of all rollouts
    back to back in two arrays. ``sample`` hands out ``Rollout`` records rebuilt from them.

    Args: capacity N (rollouts, all shards together), sampling mode, delta in [0, 1),
    shards = trainers T (each draws batch_size / T from its own shard), lifo (no-buffer queue),
    group_size G (the group modes insert and draw whole groups: rollouts must be added group
    by group, each group's G rollouts one after another), horizon_growth g in [0, 1] and
    max_horizon x_max >= 1 steps or None (a horizon that grows, theory.md section 11.13: a draw at
    step t evicts what was inserted before the last ``growing_window`` steps; 0 = off).
    """

    def __init__(self, capacity: int, *, sampling: str = "with_replacement",
                 delta: float = 0.0, shards: int = 1, lifo: bool = False,
                 group_size: int = 1, horizon_growth: float = 0.0,
                 max_horizon: float | None = None):
        self.index = ReplayIndex(capacity, sampling=sampling, delta=delta, shards=shards,
                                 lifo=lifo, group_size=group_size,
                                 horizon_growth=horizon_growth, max_horizon=max_horizon)
        self._init_store()

    @classmethod
    def for_config(cls, cfg) -> "RolloutBuffer":
        """The buffer of a run configuration (a ``Config``): on-policy, the LIFO queue of
        capacity B (each rollout used once); else ``buffer.*`` with one shard per trainer in
        "async" (with buffer.horizon_growth > 0 its window grows to x_max =
        ``BufferConfig.max_horizon``)."""
        sc, b = cfg.schedule, cfg.buffer
        if sc.mode == "on_policy":
            return cls(sc.batch_size, lifo=True)
        growing = {} if b.horizon_growth == 0 else \
            {"horizon_growth": b.horizon_growth,
             "max_horizon": b.max_horizon(rollouts_per_step(sc, sc.mu_accounting))}
        return cls(b.capacity, sampling=b.sampling, delta=b.delta, lifo=b.lifo,
                   shards=buffer_shards(sc), group_size=sc.group_size, **growing)

    def _init_store(self) -> None:
        self._rows = IdTable(PAYLOAD_COLUMNS)
        self._tokens, self._logprobs = _Arena(np.int32), _Arena(np.float32)

    def __len__(self) -> int:
        return len(self.index)

    def _append(self, arena: _Arena, column: str, flat: np.ndarray, lengths) -> np.ndarray:
        """Append rows of ``lengths`` (concatenated in ``flat``) to ``arena``, repacking the
        held rows first if it is full; returns the new rows' starts."""
        if arena.end + flat.size > arena.data.size:
            rows, c = self._rows.live_rows(), self._rows.cols
            held = c["completion_len"][rows].astype(np.int64)
            if column == "tokens_at":
                held += c["prompt_len"][rows]
            c[column][rows] = arena.repack(c[column][rows], held, flat.size)
        return arena.append(flat) + np.cumsum(lengths) - lengths

    def _store(self, rollouts: list[Rollout]) -> None:
        """Append the payloads of ``rollouts`` to the columns and arenas."""
        plen = np.array([len(r.prompt) for r in rollouts], dtype=np.int64)
        clen = np.array([len(r.completion) for r in rollouts], dtype=np.int64)
        tokens_at = self._append(self._tokens, "tokens_at", np.concatenate(
            [a for r in rollouts for a in (r.prompt, r.completion)]), plen + clen)
        logprobs_at = self._append(self._logprobs, "logprobs_at",
                                   np.concatenate([r.logprobs for r in rollouts]), clen)
        self._rows.insert(
            [r.item_id for r in rollouts], group_id=[r.group_id for r in rollouts],
            problem_id=[r.problem_id for r in rollouts], version=[r.version for r in rollouts],
            reward=[r.reward for r in rollouts], advantage=[r.advantage for r in rollouts],
            tokens_at=tokens_at, logprobs_at=logprobs_at, prompt_len=plen, completion_len=clen)

    def _rollouts(self, ids) -> list[Rollout]:
        """``Rollout`` records (fresh arrays) of held ids."""
        c, rows = self._rows.cols, self._rows.rows(ids)
        out = []
        for i, k in zip(np.asarray(ids).tolist(), rows.tolist()):
            t, p, n, lp = (int(c["tokens_at"][k]), int(c["prompt_len"][k]),
                           int(c["completion_len"][k]), int(c["logprobs_at"][k]))
            out.append(Rollout(item_id=i, group_id=int(c["group_id"][k]),
                               problem_id=int(c["problem_id"][k]), version=int(c["version"][k]),
                               prompt=self._tokens.data[t:t + p].copy(),
                               completion=self._tokens.data[t + p:t + p + n].copy(),
                               logprobs=self._logprobs.data[lp:lp + n].copy(),
                               reward=float(c["reward"][k]), advantage=float(c["advantage"][k])))
        return out

    def rollouts(self) -> list[Rollout]:
        """Every held rollout, in increasing item id order."""
        return self._rollouts(self._rows.ids[self._rows.live_rows()])

    def probe_groups(self, group_size: int, versions, limit: int) -> HeldRollouts:
        """The buffer groups the gradient probes read (theory.md section 4), with their index
        metadata: up to ``limit`` (>= 0) complete groups (``group_size`` >= 1 rollouts held)
        whose weight version is in ``versions``, spread evenly over their insertion steps
        (ties by group id), in that order, each group's rollouts in item id order. Only these
        are materialised, so a buffer in another process sends a few groups, not N rollouts."""
        rows = self._rows.live_rows()
        ids = self._rows.ids[rows]  # increasing, as in ``rollouts``
        if not ids.size or limit < 1:
            return HeldRollouts([], np.zeros(0, np.int64), np.zeros(0, np.int64))
        gids = self._rows.cols["group_id"][rows]
        meta = self.index.metadata(ids)
        # return_index gives each group's lowest item id: its version and insertion step.
        groups, first, counts = np.unique(gids, return_index=True, return_counts=True)
        keep = (counts == group_size) & np.isin(self._rows.cols["version"][rows[first]],
                                                np.fromiter(versions, np.int64))
        groups, insert = groups[keep], meta["insert_step"][first[keep]]
        if not groups.size:
            return HeldRollouts([], np.zeros(0, np.int64), np.zeros(0, np.int64))
        groups = groups[np.lexsort((groups, insert))]
        pick = np.unique(np.round(np.linspace(0, groups.size - 1, min(limit, groups.size))))
        at = np.concatenate([np.flatnonzero(gids == g) for g in groups[pick.astype(int)]])
        return HeldRollouts(self._rollouts(ids[at]), meta["insert_step"][at], meta["uses"][at])

    def versions(self) -> np.ndarray:
        """Weight version of every held rollout."""
        return self._rows.cols["version"][self._rows.live_rows()]

    def add(self, rollouts: list[Rollout], insert_step: int) -> np.ndarray:
        """Insert rollouts at trainer step ``insert_step``; returns the evicted ids."""
        if not rollouts:
            return np.zeros(0, dtype=np.int64)
        evicted = self.index.add([r.item_id for r in rollouts], [r.version for r in rollouts],
                                 insert_step, positive=[r.reward > 0 for r in rollouts],
                                 group=[r.group_id for r in rollouts])
        self._store(rollouts)
        self._rows.delete(evicted)
        return evicted

    def can_sample(self, batch_size: int) -> bool:
        """Whether every shard can give its batch_size / T rollouts now."""
        per = batch_size // self.index.shards
        return all(self.index.can_sample(per, k) for k in range(self.index.shards))

    def expire(self, step: int) -> None:
        """With a growing horizon, drop the rollouts outside trainer step ``step``'s window
        (``ReplayIndex.expire``; nothing when off). ``sample`` does it first; calling it
        earlier in the step (before the probes read the buffer) changes no draw."""
        self._rows.delete(self.index.expire(step))

    def sample(self, batch_size: int, step: int, rng: np.random.Generator) -> list[Rollout]:
        """Draw batch_size rollouts (batch_size / T per shard; whole groups with a group
        sampling mode) for trainer step ``step``."""
        self.expire(step)
        per = batch_size // self.index.shards
        ids = np.concatenate([self.index.sample(per, step, rng, shard=k)
                              for k in range(self.index.shards)])
        batch = self._rollouts(ids)
        if self.index.lifo:  # the queue hands each rollout out once
            self._rows.delete(ids)
        return batch

    def sample_shard(self, n: int, step: int, rng: np.random.Generator,
                     shard: int) -> list[Rollout]:
        """Draw ``n`` rollouts from ``shard`` alone for trainer step ``step`` (one trainer's
        part of the batch when the trainers are separate processes)."""
        self.expire(step)
        ids = self.index.sample(n, step, rng, shard=shard)
        batch = self._rollouts(ids)
        if self.index.lifo:
            self._rows.delete(ids)
        return batch

    def drop(self, ids) -> int:
        """Evict the held rollouts ``ids`` now (``ReplayIndex.drop``); returns how many were
        held."""
        gone = self.index.drop(ids)
        self._rows.delete(gone)
        return int(gone.size)

    def nbytes(self) -> int:
        """Bytes of the payload storage (columns and arenas, slack included)."""
        return self._rows.nbytes() + self._tokens.data.nbytes + self._logprobs.data.nbytes

    def step_stats(self) -> dict:
        """The three axes over the uses of the last ``sample`` call (one trainer step).
        Staleness is the consumption lag: the trainer step minus the weight version that
        generated the rollout, time in queues and in the buffer included (trainer steps)."""
        rec = self.index.use_records(last_calls=self.index.shards)
        stale, since = rec["staleness"], rec["since_last_use"]
        reused = since[since != NEW]
        q50, q90 = self.index.replay_ratio_quantiles((0.5, 0.9))
        return {
            "staleness_mean": float(stale.mean()) if stale.size else None,
            "staleness_q50": float(np.quantile(stale, 0.5)) if stale.size else None,
            "staleness_q90": float(np.quantile(stale, 0.9)) if stale.size else None,
            "staleness_max": int(stale.max()) if stale.size else None,
            "steps_since_last_use_mean": float(reused.mean()) if reused.size else None,
            "steps_since_last_use_q50": float(np.quantile(reused, 0.5)) if reused.size else None,
            "first_use_fraction": float(np.mean(since == NEW)) if since.size else None,
            "replay_ratio_q50": None if np.isnan(q50) else float(q50),
            "replay_ratio_q90": None if np.isnan(q90) else float(q90),
            "buffer_occupancy": len(self),
        }

    def state_dict(self) -> dict:
        """Index state and payloads as plain objects (for checkpoints)."""
        return {"index": self.index.state_dict(),
                "store": [asdict(r) for r in self.rollouts()]}

    @classmethod
    def from_state_dict(cls, state: dict) -> "RolloutBuffer":
        """Rebuild a buffer saved with ``state_dict``."""
        buf = cls.__new__(cls)
        buf.index = ReplayIndex.from_state_dict(state["index"])
        buf._init_store()
        if state["store"]:
            buf._store([Rollout(**r) for r in state["store"]])
        return buf
