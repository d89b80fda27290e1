"""What a schedule makes per trainer step, as plain arithmetic of a ``ScheduleConfig``
(theory.md sections 3-4).

It imports nothing of ours, so that config.py can size the buffer from it without importing the
run's schedule (``schedule.py``), which reaches the samplers.
"""

from __future__ import annotations


def rollouts_per_step(sc, mu: float | None = None) -> float:
    """R, rollouts made per trainer step by the schedule ``sc`` (a ``ScheduleConfig``; theory.md
    sections 3-4): B on-policy, B / y sync, B W / (T mu) async (``mu`` > 0 needed there)."""
    if sc.mode == "on_policy":
        return float(sc.batch_size)
    if sc.mode == "sync":
        return sc.batch_size / sc.replay_ratio
    return sc.batch_size * sc.workers / (sc.trainers * mu)


def buffer_shards(sc) -> int:
    """Buffer shards of the schedule ``sc``: one per trainer in "async", else 1."""
    return sc.trainers if sc.mode == "async" else 1
