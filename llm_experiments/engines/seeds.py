"""Seeds of the side streams (evaluation, probes) that must never touch a run's own generator.

A side stream at trainer step t is seeded from (run.seed, t, stream), so it is the same whether
the run was resumed or not, and drawing from it leaves the training draws unchanged.
"""

from __future__ import annotations

import numpy as np

# Stream numbers of the side streams; the run's own generator is seeded with run.seed alone.
EVAL_STREAM, PROBE_STREAM = 1, 2
# The Ray engine's buffer actor draws batches from its own stream (engines/ray_engine.py).
BUFFER_STREAM = 3
# A Ray sampler actor's injected generation delay (schedule.injected_gen_delay), one stream per
# actor: (run.seed, actor index, DELAY_STREAM).
DELAY_STREAM = 4
# Long-range panel probes (panel.py): their rollouts and reference gradients.
PANEL_STREAM = 5
# The probes' gradient sketch (sketch.py), one projection per run: (run.seed, SKETCH_STREAM).
SKETCH_STREAM = 6
# Align panels (align.py): their rollouts and reference groups.
ALIGN_STREAM = 7


def derived_seed(*parts: int) -> int:
    """A 32-bit seed (0 <= seed < 2**32) mixed from non-negative integers ``parts``
    (numpy ``SeedSequence``), e.g. (run.seed, step, stream)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])
