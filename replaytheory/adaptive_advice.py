"""Whether the advice names the adaptive buffer (theory.md section 13.2): a buffer that never
evicts by age and drops, after each update, the rollouts whose mean (log r)^2 at the update's
weights passed ``TAU`` (section 12.4), as an alternative to the fixed horizon.

The evidence (``ADAPTIVE_EVIDENCE_PATH``, written by ``python -m replaytheory.evidence``) holds,
per setting where the adaptive arm was paired with x = 64 of the same loss, replay ratio and
learning rate, each seed's AUC (mean eval accuracy over the run's evaluations) of both arms.

The rule, fixed in ``experiments/adaptive_transfer.yaml`` before the arm ran on any setting but
the two it was found on: the adaptive buffer is named only if, on every setting, the paired
mean difference AUC(adaptive) - AUC(x = 64) is >= 0 and, on at least half of the settings,
its 95% seed-bootstrap interval lies above 0; it is read only once ``MIN_SETTINGS`` settings
(the registered ones) are in. It was measured with grpo at y = 2, so it is
offered only with grpo and a buffer (never with on-policy advice).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from . import checks
from .loss_advice import DEFAULT_LOSS, paired_interval

ADAPTIVE_EVIDENCE_PATH = Path(__file__).resolve().parent / "data" / "adaptive_evidence.json"
TAU = 0.05  # nats^2: the registered threshold (theory.md 12.6), not retuned
HORIZON = 1024.0  # updates: the age bound of the buffer that never evicts by age
FIXED_HORIZON = 64.0  # the fixed arm it is paired with
# The rule is read once the registered settings are in: the two it was found on and the four
# of experiments/adaptive_transfer.yaml.
MIN_SETTINGS = 6


@dataclass(frozen=True)
class AdaptivePair:
    """One setting where the adaptive arm ran beside x = 64: the setting's name, grid, run
    length T (updates), learning rate, replay ratio y, loss, tau (nats^2) and each arm's AUC
    per seed (``{seed: auc}``)."""

    setting: str
    grid: str
    run_updates: int
    lr: float
    replay_ratio: float
    loss: str
    tau: float
    adaptive: dict
    fixed: dict

    @classmethod
    def from_record(cls, r: dict) -> "AdaptivePair":
        return cls(r["setting"], r["grid"], int(r["run_updates"]), float(r["lr"]),
                   float(r["replay_ratio"]), r["loss"], float(r["tau"]),
                   dict(zip(r["seeds_adaptive"], r["auc_adaptive"])),
                   dict(zip(r["seeds_fixed"], r["auc_fixed"])))


@dataclass(frozen=True)
class AdaptiveComparison:
    """AUC(adaptive) - AUC(x = 64) on one setting, paired by seed: the mean and its 95%
    seed-bootstrap interval (accuracy points) over ``seeds`` shared seeds."""

    setting: str
    mean: float
    low: float
    high: float
    seeds: int


@dataclass(frozen=True)
class AdaptiveAdvice:
    """The adaptive buffer as the advice's alternative: named (whether the rule of theory.md
    13.2 names it), drop_logr2 (tau, nats^2), horizon (updates), the comparisons the rule read
    and a one-line reason with the deciding numbers."""

    named: bool
    drop_logr2: float
    horizon: float
    comparisons: tuple[AdaptiveComparison, ...]
    reason: str

    def to_dict(self) -> dict:
        return {**self.__dict__, "comparisons": [c.__dict__ for c in self.comparisons]}

    def names(self, rollouts_per_step: int) -> dict:
        """The buffer in the names of the harness and of ``ReplayGRPOTrainer``'s
        ``ReplaySettings`` for R = ``rollouts_per_step`` new rollouts per update (integer
        >= 1): ``drop_logr2`` and ``replay_buffer_size`` (horizon x R rollouts)."""
        r = checks.integer("rollouts_per_step", rollouts_per_step, 1)
        return {"drop_logr2": self.drop_logr2, "replay_buffer_size": int(self.horizon * r)}


def load_adaptive_evidence(path: str | Path = ADAPTIVE_EVIDENCE_PATH) -> list[AdaptivePair]:
    """The pairs of ``path`` (a JSON list, ``evidence.collect_adaptive``); none if absent."""
    path = Path(path)
    return [AdaptivePair.from_record(r) for r in json.loads(path.read_text())] \
        if path.exists() else []


def compare_adaptive(pairs: list[AdaptivePair]) -> tuple[AdaptiveComparison, ...]:
    """Each setting's paired difference at ``TAU`` under grpo (settings with fewer than
    ``loss_advice.MIN_SEEDS`` shared seeds are left out)."""
    out = []
    for p in pairs:
        if p.loss != DEFAULT_LOSS or abs(p.tau - TAU) > 1e-12:
            continue
        d = paired_interval(p.adaptive, p.fixed)
        if d is not None:
            out.append(AdaptiveComparison(p.setting, d.mean, d.low, d.high, d.seeds))
    return tuple(out)


def choose_adaptive(loss: str, on_policy: bool,
                    pairs: list[AdaptivePair]) -> AdaptiveAdvice | None:
    """The adaptive alternative for advice with ``loss`` (``on_policy``: no buffer), by the
    module's rule; None for on-policy advice or a loss it was not measured with."""
    if on_policy or loss != DEFAULT_LOSS:
        return None
    comps = compare_adaptive(pairs)
    if len(comps) < MIN_SETTINGS:
        return AdaptiveAdvice(False, TAU, HORIZON, comps,
                              f"not named: measured on {len(comps)} of the {MIN_SETTINGS} "
                              "registered settings (experiments/adaptive_transfer.yaml)")
    worst = min(comps, key=lambda c: c.mean)
    above = sum(c.low > 0 for c in comps)
    named = worst.mean >= 0 and 2 * above >= len(comps)
    why = (f"adaptive minus x = 64 over {len(comps)} settings: interval above 0 on {above}; "
           f"least mean {worst.mean:+.3f} [{worst.low:+.3f}, {worst.high:+.3f}] on "
           f"{worst.setting} ({worst.seeds} seeds)")
    return AdaptiveAdvice(named, TAU, HORIZON, comps,
                          ("named (theory.md 13.2): " if named else
                           "not named (theory.md 13.2): ") + why)
