"""Where a run's wall time went, per side (sampler, trainer), for every schedule (issue 37).

One record shape for the serial engine (``experiment.Experiment``: one thread, the sides take
turns), the overlapped one (``overlap.OverlapRun``: a sampler thread beside the trainer) and
the Ray engine (``ray_engine.RayRun`` and its actors' loop: each side the mean over its
actors), so that figures can put the schedules side by side from saved results. All values
are seconds (>= 0 except ``other``, a remainder), over every session of a resumed run.

Per side, the keys ``SIDE_KEYS``, which sum to the run's wall time exactly:

* generate: decoding (``ComputeClock.gen_seconds`` of the rollouts made);
* grade: turning completions into rollouts (reward, group advantages);
* update: the trainer's optimizer steps (``ComputeClock.train_seconds``);
* eval: held-out evaluations; probe: gradient probes; checkpoint: writing checkpoints;
* idle: waiting for the other side. Serial: the other side's work (one core, in turns).
  Overlapped: measured blocking (the trainer waiting for a chunk, the sampler waiting for
  an order, i.e. for room in the bounded handoff);
* other: the rest (inserting and drawing from the buffer, logging, weight publishing; in the
  serial engine also anything neither side's timers cover; on Ray also the start-up before
  the actors are up, and a trainer's step call beyond its update).

On Ray the driver evaluates and checkpoints, not the trainer, so a trainer's eval and
checkpoint are 0 (it waits meanwhile: idle), and a sampler's grade is its chunk call beyond
decoding (grading, prompt encoding and loading new weights, not timed apart).
"""

from __future__ import annotations

SIDE_KEYS = ("generate", "grade", "update", "eval", "probe", "checkpoint", "idle", "other")
# The parts of the run each side owns (the rest of a side's time is idle or other).
SAMPLER_PARTS = ("generate", "grade")
TRAINER_PARTS = ("update", "eval", "probe", "checkpoint")


def _side(wall: float, parts: dict, idle: float) -> dict:
    """One side's row: ``parts`` (a subset of SIDE_KEYS, seconds), ``idle``, and ``other``
    = ``wall`` less both, so that the row sums to ``wall``."""
    row = dict.fromkeys(SIDE_KEYS, 0.0)
    row.update(parts)
    row["idle"] = idle
    row["other"] = wall - sum(parts.values()) - idle
    return row


def _parts(c: dict) -> tuple[dict, dict]:
    """(sampler parts, trainer parts) from run counters ``c`` (``RunBooks.counters`` keys)."""
    sampler = {"generate": c["gen_seconds"], "grade": c.get("grade_seconds", 0.0)}
    trainer = {"update": c["train_seconds"], "eval": c.get("eval_seconds", 0.0),
               "probe": c.get("probe_seconds", 0.0),
               "checkpoint": c.get("checkpoint_seconds", 0.0)}
    return sampler, trainer


def serial_breakdown(c: dict) -> dict:
    """The breakdown of a serial run (one thread) from its counters ``c``: each side is idle
    while the other works; ``other`` is what neither side's timers cover (the same on both)."""
    wall = c["wall_time"]
    sampler, trainer = _parts(c)
    s_busy, t_busy = sum(sampler.values()), sum(trainer.values())
    return {"schedule": "serial", "wall_seconds": wall,
            "sampler": _side(wall, sampler, t_busy), "trainer": _side(wall, trainer, s_busy)}


def overlap_breakdown(c: dict, sampler_seconds: dict, trainer_wait: float) -> dict:
    """The breakdown of an overlapped run from its counters ``c`` (the trainer's clock),
    ``sampler_seconds`` (the sampler's own, generate, grade and idle = waiting for an order,
    of the chunks the trainer has taken; the sampler's start-up and the chunk in the making
    fall in ``other``) and ``trainer_wait`` (seconds the trainer waited for a chunk)."""
    wall = c["wall_time"]
    _, trainer = _parts(c)
    sampler = {k: sampler_seconds[k] for k in SAMPLER_PARTS}
    return {"schedule": "overlap", "wall_seconds": wall,
            "sampler": _side(wall, sampler, sampler_seconds["idle"]),
            "trainer": _side(wall, trainer, trainer_wait)}


def _actor_mean(seconds: dict, side: str) -> float:
    """Mean over the actors of ``side`` ("sampler" or "trainer") of per-actor ``seconds``
    (0 before any is counted)."""
    vals = [v for k, v in seconds.items() if k.startswith(side)]
    return sum(vals) / len(vals) if vals else 0.0


def actors_breakdown(c: dict) -> dict:
    """The breakdown of a Ray run from its counters ``c`` (``RayRun.counters``: the run's,
    and per actor busy and idle seconds): each side the mean over its actors (module
    docstring); the trainer's update and probes are rank 0's."""
    wall = c["wall_time"]
    busy, idle = c["busy_seconds"], c["idle_seconds"]
    samplers = sum(k.startswith("sampler") for k in busy) or 1
    gen = c["gen_seconds"] / samplers
    sampler = {"generate": gen, "grade": max(0.0, _actor_mean(busy, "sampler") - gen)}
    trainer = {"update": c["train_seconds"], "probe": c.get("probe_seconds", 0.0)}
    return {"schedule": "ray", "wall_seconds": wall,
            "sampler": _side(wall, sampler, _actor_mean(idle, "sampler")),
            "trainer": _side(wall, trainer, _actor_mean(idle, "trainer"))}
