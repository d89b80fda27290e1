"""Rollout payloads around ``replaytheory.buffer.ReplayIndex`` (theory.md sections 1-2).

``ReplayIndex`` decides which rollouts are held and drawn (FIFO capacity N, sampling modes,
positive bias delta, one shard per trainer, the LIFO no-buffer queue) and records every use.
This module keeps what the trainer needs of each rollout, compactly (int32 token ids, float32
behaviour log-probs, the advantage computed once at generation), in a store keyed by item id,
and drops a payload as soon as the index evicts (or, for LIFO, consumes) it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from replaytheory.buffer import NEW, ReplayIndex


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


class RolloutBuffer:
    """A replay buffer of ``Rollout`` payloads (semantics: ``ReplayIndex``).

    Args: capacity N (rollouts, all shards together), sampling mode, delta in [0, 1),
    shards = trainers T (each draws batch_size / T from its own shard), lifo (no-buffer queue).
    """

    def __init__(self, capacity: int, *, sampling: str = "with_replacement",
                 delta: float = 0.0, shards: int = 1, lifo: bool = False):
        self.index = ReplayIndex(capacity, sampling=sampling, delta=delta, shards=shards,
                                 lifo=lifo)
        self.store: dict[int, Rollout] = {}

    def __len__(self) -> int:
        return len(self.index)

    def add(self, rollouts: list[Rollout], insert_step: int) -> np.ndarray:
        """Insert rollouts at trainer step ``insert_step``; returns the evicted ids."""
        if not rollouts:
            return np.zeros(0, dtype=np.int64)
        evicted = self.index.add([r.item_id for r in rollouts], [r.version for r in rollouts],
                                 insert_step, positive=[r.reward > 0 for r in rollouts])
        for r in rollouts:
            self.store[r.item_id] = r
        for key in evicted:
            del self.store[int(key)]
        return evicted

    def can_sample(self, batch_size: int) -> bool:
        """Whether every shard can give its batch_size / T rollouts now."""
        per = batch_size // self.index.shards
        return all(self.index.can_sample(per, k) for k in range(self.index.shards))

    def sample(self, batch_size: int, step: int, rng: np.random.Generator) -> list[Rollout]:
        """Draw batch_size rollouts (batch_size / T per shard) for trainer step ``step``."""
        per = batch_size // self.index.shards
        ids = np.concatenate([self.index.sample(per, step, rng, shard=k)
                              for k in range(self.index.shards)])
        batch = [self.store[int(i)] for i in ids]
        if self.index.lifo:  # the queue hands each rollout out once
            for i in ids:
                del self.store[int(i)]
        return batch

    def step_stats(self) -> dict:
        """The three axes over the uses of the last ``sample`` call (one trainer step)."""
        rec = self.index.use_records(last_calls=self.index.shards)
        stale, since = rec["staleness"], rec["since_last_use"]
        reused = since[since != NEW]
        uses = self.index.replay_ratios()
        return {
            "staleness_mean": float(stale.mean()) if stale.size else None,
            "staleness_q50": float(np.quantile(stale, 0.5)) if stale.size else None,
            "staleness_q90": float(np.quantile(stale, 0.9)) if stale.size else None,
            "steps_since_last_use_mean": float(reused.mean()) if reused.size else None,
            "steps_since_last_use_q50": float(np.quantile(reused, 0.5)) if reused.size else None,
            "first_use_fraction": float(np.mean(since == NEW)) if since.size else None,
            "replay_ratio_q50": float(np.quantile(uses, 0.5)) if uses.size else None,
            "replay_ratio_q90": float(np.quantile(uses, 0.9)) if uses.size else None,
            "buffer_occupancy": len(self),
        }

    def state_dict(self) -> dict:
        """Index state and payloads as plain objects (for checkpoints)."""
        return {"index": self.index.state_dict(),
                "store": [asdict(r) for r in self.store.values()]}

    @classmethod
    def from_state_dict(cls, state: dict) -> "RolloutBuffer":
        """Rebuild a buffer saved with ``state_dict``."""
        buf = cls.__new__(cls)
        buf.index = ReplayIndex.from_state_dict(state["index"])
        buf.store = {int(r["item_id"]): Rollout(**r) for r in state["store"]}
        return buf
