"""Engines that run the W workers / T trainers system (``schedule.engine``), over one run loop
(``loop.py``: the step sequence, records, checkpoints, and the counters and summary, ``RunBooks``).

* ``emulated`` (default): one process, one CPU stream, deterministic (``experiment.py``):
  production follows ``schedule.Production`` (rates from ``schedule.mu_accounting``, a fixed
  latency), no real concurrency; bitwise reproducible and resumable.
* ``ray``: real concurrency on a Ray cluster (``ray_engine.py``): W sampler actors, one buffer
  actor, T trainer actors in one torch.distributed group; the production rate, the latency
  and therefore the staleness come from the clock. Needs the ``ray`` package (the ``ray``
  extra); this package does not import it. ``schedule.ray_loop=actors`` (``ray_pull.py``)
  takes the driver out of the per-step loop: samplers and trainers loop among themselves
  through the buffer actor.
* ``overlap``: sampler and trainer side by side on one machine (``overlap.py``): a sampler
  loop in a thread or a child process (``overlap_sampler.py``) makes the schedule's rollouts
  (on_policy or sync quotas) while the trainer updates, through a bounded FIFO handoff of
  ``schedule.overlap_ahead`` chunks; weights reach the sampler by a publish the trainer never
  waits on. Resumable, not bitwise (the staleness comes from the clock).
"""

# ``schedule.engine`` is one of these.
ENGINES = ("emulated", "ray", "overlap")
# Where the overlapped engine's sampler runs (``schedule.overlap_sampler``).
OVERLAP_SAMPLERS = ("thread", "process")
# Who runs the Ray engine's per-step loop (``schedule.ray_loop``): the driver, or the actors.
RAY_LOOPS = ("driver", "actors")
