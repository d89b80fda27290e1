"""Which loss the advice names (replaytheory.loss_advice, theory.md 13.1): the committed loss
evidence is what the committed loss grids hold, and the rule names a stale-rollout loss only
where it beats grpo, paired by seed, on every grid that measured it."""

import json

import numpy as np
import pytest

from replaytheory.advice import advise
from replaytheory.loss_advice import (LOSS_EVIDENCE_PATH, LossGrid, choose_loss, compare_losses,
                                      paired_interval)
from tests.test_advice import _grid


def _loss_grid(setting, diffs, x=64.0, seeds=(0, 1, 2, 3, 4), base=0.5):
    """A grid with grpo at ``base`` + seed noise and each loss at grpo + its diff per seed,
    at horizons x and 4 x (the same scores at both)."""
    noise = {s: 0.01 * ((s * 7) % 5) for s in seeds}
    cells = {}
    for h in (x, 4 * x):
        cells[("grpo", h)] = {s: base + noise[s] for s in seeds}
        for loss, d in diffs.items():
            d = np.broadcast_to(np.asarray(d, float), (len(seeds),))
            cells[(loss, h)] = {s: base + noise[s] + di for s, di in zip(seeds, d)}
    return LossGrid(setting, 300, 1e-4, 2.0, cells)


def test_the_committed_loss_evidence_is_what_the_committed_grids_hold():
    from replaytheory.evidence import collect_losses
    assert collect_losses() == json.loads(LOSS_EVIDENCE_PATH.read_text())


def test_a_loss_that_beats_grpo_on_every_grid_is_named():
    grids = [_loss_grid("a", {"neg_clip": [0.03, 0.05, 0.04, 0.06, 0.05], "m2po": -0.1}),
             _loss_grid("b", {"neg_clip": [0.00, 0.02, 0.01, 0.00, 0.02]})]
    loss, comparisons = choose_loss(64.0, 2.0, grids)
    assert loss == "neg_clip"
    a = next(c for c in comparisons if c.setting == "a" and c.loss == "neg_clip")
    assert a.mean == pytest.approx(0.046) and a.low > 0 and a.seeds == 5
    assert {(c.loss, c.setting) for c in comparisons} == {("neg_clip", "a"), ("m2po", "a"),
                                                        ("neg_clip", "b")}


def test_a_loss_worse_on_one_grid_or_never_clear_of_zero_is_not_named():
    mixed = [_loss_grid("a", {"cispo": 0.05}), _loss_grid("b", {"cispo": -0.01})]
    assert choose_loss(64.0, 2.0, mixed)[0] == "grpo"
    noisy = [_loss_grid("a", {"cispo": [0.08, -0.06, 0.07, -0.05, 0.01]})]
    assert choose_loss(64.0, 2.0, noisy)[0] == "grpo"


def test_on_policy_names_grpo_and_too_few_seeds_compare_nothing():
    grids = [_loss_grid("a", {"neg_clip": 0.05})]
    assert choose_loss(1.0, 1.0, grids) == ("grpo", ())
    assert compare_losses(64.0, [_loss_grid("a", {"neg_clip": 0.05}, seeds=(0, 1))]) == []
    assert paired_interval({0: 1.0, 1: 2.0}, {0: 1.0, 1: 1.0}) is None
    d = paired_interval({0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.0, 1: 1.0, 2: 1.0})
    assert (d.mean, d.seeds) == (1.0, 3) and 0.0 <= d.low <= d.mean <= d.high <= 2.0


def test_the_grid_horizon_nearest_the_advice_is_compared():
    g = _loss_grid("a", {"neg_clip": 0.05}, x=16.0)  # horizons 16 and 64
    assert g.nearest_horizon(20.0) == 16.0 and g.nearest_horizon(50.0) == 64.0
    assert g.nearest_horizon(32.0) == 64.0  # equally near: the longer
    assert {c.horizon for c in compare_losses(1000.0, [g])} == {64.0}


def test_the_advice_carries_the_loss_and_its_evidence():
    ev = [_grid("a", "a", [0.50, 0.55, 0.52, 0.60])]
    grids = [_loss_grid("s", {"neg_veto": [0.03, 0.05, 0.04, 0.06, 0.05]})]
    a = advise(2.0, 100, evidence=ev, loss_evidence=grids)
    assert a.horizon == 64.0 and a.loss == "neg_veto"
    assert a.names(32)["loss_type"] == "neg_veto"
    assert "neg_veto minus grpo at x = 64" in a.provenance["loss"]
    assert a.to_dict()["loss_comparisons"][0]["loss"] == "neg_veto"
    plain = advise(2.0, 100, evidence=ev, loss_evidence=[])
    assert plain.loss == "grpo" and plain.loss_comparisons == ()
