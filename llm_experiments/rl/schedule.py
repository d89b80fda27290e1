"""Who produces how many rollouts, with which weights, and what it costs (theory.md s1-4).

* ``Production``: before trainer step t, generate ``groups_due(t)`` prompt groups with weight
  version ``version(t)``. The fractional rate is exact on average: after t steps exactly
  floor(t * rate) groups were due, so a replay ratio of 1.4 alternates counts.
    - on_policy: R = B rollouts per step, current weights (LIFO queue, each used once).
    - sync: R = B / y rollouts per step, current weights (the theory's synchronous model).
    - async: R = B W / (T mu) rollouts per step (W workers each making a batch of B in mu C
      while T trainers make one update in C / T; section 3), with the weights the workers
      hold: published every k steps and ``latency`` steps old (a worker needs mu T trainer
      steps to finish a batch). Deterministic: no timing enters.
  When the buffer cannot yet give a batch (first steps; LIFO), whole groups more are made
  (``Production.fill``); the config checks guarantee that a bounded number suffices.
* ``WeightStore``: published weight snapshots by version, on the model's device.
* ``ComputeClock``: seconds, tokens and FLOPs of generation and training; the measured mu
  (time and FLOPs) and compute in units of one trainer update, steps + mu * generated / B.
"""

from __future__ import annotations

import math
from typing import Callable

from replaytheory.model.compute import mu_from_costs

from ..samplers import WeightUpdate
from .rates import buffer_shards, rollouts_per_step


class Production:
    """The production side of a run (see the module docstring). ``mu``: accounting mu."""

    def __init__(self, cfg_schedule, mu: float | None = None):
        sc = cfg_schedule
        self.mode, self.group_size, self.batch_size = sc.mode, sc.group_size, sc.batch_size
        self.shards = buffer_shards(sc)
        self.rollouts_per_step = rollouts_per_step(sc, mu)
        self.groups_per_step = self.rollouts_per_step / sc.group_size
        if sc.mode == "async":
            self.refresh = sc.refresh_every
            self.latency = sc.latency_steps if sc.latency_steps >= 0 else \
                int(round(mu * sc.trainers))
        else:
            self.refresh, self.latency = 1, 0
        # Each extra group gives each shard >= floor(G/T) more of its B/T rollouts (round
        # robin), and a shard that a FIFO eviction touched already holds all it can keep,
        # which the config checks is >= B/T: so ceil((B + T - 1) / G) extra groups always do.
        self.max_extra_groups = -(-(self.batch_size + self.shards - 1) // self.group_size)

    def groups_due(self, step: int) -> int:
        """Prompt groups to generate before trainer step ``step`` (>= 0)."""
        return math.floor((step + 1) * self.groups_per_step + 1e-9) - \
            math.floor(step * self.groups_per_step + 1e-9)

    def version(self, step: int) -> int:
        """Weight version (a trainer step) the producers use before step ``step``."""
        return max(0, step - self.latency) // self.refresh * self.refresh

    def publishes(self, step: int) -> bool:
        """Whether the weights before step ``step`` (>= 0) must be kept as a snapshot for the
        producers: a refresh step of a schedule whose producers use a version after its
        trainer step has passed (latency > 0, or refresh > 1 and a sampler that evaluation or
        a resume reloaded). Otherwise the producers only ever take the current weights."""
        return step % self.refresh == 0 and (self.latency > 0 or self.refresh > 1)

    def fill(self, buffer, step: int, produce: Callable[[int, int], list]) -> list:
        """Make the rollouts of trainer step ``step`` and insert them into ``buffer`` (a
        ``RolloutBuffer``): ``groups_due(step)`` groups, then one group at a time until the
        buffer can give a batch of B (whole groups: advantages are normalised per group,
        theory.md section 6).
        ``produce(n_groups, version)`` makes the rollouts. Returns every rollout made."""
        version = self.version(step)
        new = produce(self.groups_due(step), version)
        buffer.add(new, insert_step=step)
        extra = 0
        while not buffer.can_sample(self.batch_size):
            if extra == self.max_extra_groups:
                raise RuntimeError(f"step {step}: the buffer cannot give a batch of "
                                   f"{self.batch_size} after {extra} extra groups; the config "
                                   f"checks should have refused this configuration")
            more = produce(1, version)
            new += more
            buffer.add(more, insert_step=step)
            extra += 1
        return new


class WeightStore:
    """Published weight snapshots keyed by version (trainer step), copies on the model's
    device: a sampler in the same process loads them without a trip through host memory
    (snapshots restored from a checkpoint are on the CPU)."""

    def __init__(self):
        self.snapshots: dict[int, dict] = {}  # version -> {name: tensor}

    def publish(self, version: int, model) -> None:
        """Keep a copy of the model's weights as ``version`` (once per version)."""
        if version not in self.snapshots:
            self.snapshots[version] = {k: t.detach().clone()
                                       for k, t in model.state_dict().items()}

    def update(self, version: int) -> WeightUpdate:
        """The snapshot of ``version`` as a message to a sampler."""
        return WeightUpdate(version, self.snapshots[version])

    def keep_only(self, versions) -> None:
        """Drop every snapshot whose version is not in ``versions``."""
        keep = set(versions)
        for key in [k for k in self.snapshots if k not in keep]:
            del self.snapshots[key]


class ComputeClock:
    """Costs of generation and training, accumulated over a run (theory.md section 3).

    Only rollout generation for training and trainer updates are counted (not evaluation or
    probes). FLOPs: 2 P per generated or prompt token, 6 P per trained token (P parameters).
    """

    def __init__(self, n_params: int, batch_size: int):
        self.n_params, self.batch_size = int(n_params), int(batch_size)
        self.gen_seconds = self.train_seconds = 0.0
        self.gen_tokens = self.train_tokens = 0
        self.generated = self.steps = 0

    def mu_time(self) -> float | None:
        """Measured mu: seconds to generate B rollouts over seconds of one update."""
        if not (self.generated and self.steps and self.gen_seconds and self.train_seconds):
            return None
        return mu_from_costs(self.gen_seconds / self.generated * self.batch_size,
                             self.train_seconds / self.steps)

    def mu_flops(self) -> float | None:
        """mu from the FLOPs estimate (ignores that decoding is memory-bound)."""
        if not (self.generated and self.steps and self.gen_tokens and self.train_tokens):
            return None
        return mu_from_costs(2 * self.gen_tokens / self.generated * self.batch_size,
                             6 * self.train_tokens / self.steps)

    def compute_units(self, mu: float | None) -> float | None:
        """Compute spent in units of one trainer update C: steps + mu * generated / B."""
        if mu is None:
            return None
        return self.steps + mu * self.generated / self.batch_size

    def state_dict(self) -> dict:
        """The accumulated costs (for checkpoints)."""
        return dict(vars(self))

    def load_state_dict(self, state: dict) -> None:
        """Restore costs saved by ``state_dict``."""
        vars(self).update(state)
