"""The horizon under each stale-rollout loss (theory.md section 12): ``verdicts`` judges the
registered loss grids, ``report`` writes the tables and figures (``python -m figures.losses``)."""

from figures.losses.report import main

__all__ = ["main"]
