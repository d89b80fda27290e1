"""A pilot that picks the advice's cell, the rule's or on-policy by the first updates of a
user's own setting (theory.md section 13.3).

Evidence pooled over settings cannot know which kind of setting a user has (section 13: the
settings disagree at the same run length and mu). The pilot asks the user's setting: it runs
the three arms (the advice from the evidence, the rule x = 64, y = sqrt(mu), on-policy) for the
first ``pilot_updates(T)`` updates of a T-update run, one seed each, scores each by its mean
accuracy over the accounted compute in [0, T_p (1 + mu / y_max)] (y_max the largest replay
ratio among the arms, the cheapest arm's budget, as the grids are judged), and continues the
best. The pilot's price is the two arms it stops: ``pilot_price(T)`` of the run's updates.

What a pilot cannot see: a horizon longer than T_p (the arms' buffers hold at most T_p updates
of rollouts during the pilot), and how the ranking changes after T_p (section 13: on
horizon_g4 on-policy trails at 30 updates and is best at 100).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import checks

PILOT_SHARE = 0.2  # T_p = T / 5 updates
EVAL_EVERY = 5  # updates between the pilot's evaluations
MIN_RUN_UPDATES = 100  # shorter runs get no pilot: it would be a few evaluations long
ARM_ORDER = ("advice", "rule", "on-policy")  # a tie goes to the earlier arm


@dataclass(frozen=True)
class PilotArm:
    """One arm of the pilot: its name (one of ``ARM_ORDER``), horizon x (updates, 1 with
    y = 1 for on-policy) and replay ratio y."""

    name: str
    x: float
    y: float


def pilot_updates(run_updates: int) -> int:
    """T_p for a run of T = ``run_updates`` updates (integer >= ``MIN_RUN_UPDATES``): T / 5,
    rounded down to a multiple of ``EVAL_EVERY``."""
    t = checks.integer("run_updates", run_updates, MIN_RUN_UPDATES)
    return int(t * PILOT_SHARE) // EVAL_EVERY * EVAL_EVERY


def pilot_price(run_updates: int) -> float:
    """The pilot's extra updates as a share of the run's: the two stopped arms, 2 T_p / T."""
    return 2 * pilot_updates(run_updates) / run_updates


def pilot_arms(advice: tuple[float, float], mu: float) -> tuple[PilotArm, ...]:
    """The three arms for the advice's (x, y) at cost ratio ``mu`` (> 0): the advice, the
    rule (64, max(1, sqrt(mu))) and on-policy; an arm equal to an earlier one is left out."""
    mu = checks.positive("mu", mu)
    arms = (PilotArm("advice", float(advice[0]), float(advice[1])),
            PilotArm("rule", 64.0, max(1.0, math.sqrt(mu))), PilotArm("on-policy", 1.0, 1.0))
    out: list[PilotArm] = []
    for a in arms:
        if all((a.x, a.y) != (b.x, b.y) for b in out):
            out.append(a)
    return tuple(out)


def pilot_budget(arms: tuple[PilotArm, ...], mu: float, run_updates: int) -> float:
    """The compute budget the arms are scored over: T_p (1 + mu / y_max), in on-policy
    updates of B rollouts (section 3.1's units)."""
    return pilot_updates(run_updates) * (1 + checks.positive("mu", mu) / max(a.y for a in arms))


def pick(arms: tuple[PilotArm, ...], scores: dict) -> PilotArm:
    """The arm of the highest pilot score (``scores``: {name: mean accuracy over the budget});
    a tie goes to the arm earlier in ``ARM_ORDER``. ValueError if an arm has no score."""
    missing = [a.name for a in arms if a.name not in scores]
    if missing:
        raise ValueError(f"scores must hold every arm; missing {missing}")
    return max(arms, key=lambda a: (scores[a.name], -ARM_ORDER.index(a.name)))
