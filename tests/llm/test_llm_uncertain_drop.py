"""The adaptive horizon's statistic over uncertain tokens (theory.md 12.7,
``buffer.drop_tokens_below_p``): the rows' mean (log r)^2 over the tokens whose sampling
probability was below the bound, checked on a hand-computed batch, in a run and in the TRL
drop-in's settings."""

import math

import pytest
import torch
from llm_helpers import run_small, small_config

from llm_experiments.rl.losses import TokenBatch
from llm_experiments.rl.trainer import row_logr2, uncertain_share


def _batch():
    """Two rollouts of three tokens (the second padded to two). Sampling probabilities:
    row 0 exp(-0.1) = 0.90, exp(-1) = 0.37, exp(-2) = 0.14; row 1 0.95, 0.99."""
    old = torch.tensor([[-0.1, -1.0, -2.0], [-0.05, -0.01, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    new = torch.tensor([[-0.2, -1.5, -2.0], [-0.3, -0.01, -9.0]])
    return new, TokenBatch(torch.zeros((2, 3), dtype=torch.long), mask, old,
                           torch.tensor([1.0, -1.0]))


def test_every_token_is_the_default_statistic():
    new, batch = _batch()
    assert row_logr2(new, batch) == pytest.approx([(0.01 + 0.25 + 0) / 3, 0.0625 / 2])
    assert row_logr2(new, batch, 1.0) == pytest.approx(row_logr2(new, batch))


def test_only_tokens_below_the_bound_count_and_a_row_without_one_scores_zero():
    new, batch = _batch()
    # below 0.5: row 0's tokens 1 and 2 ((0.5^2 + 0) / 2); row 1 has none (its 0.25^2 is
    # on a token sampled at 0.95, and the padded -9 never counts)
    assert row_logr2(new, batch, 0.5) == pytest.approx([0.125, 0.0])
    assert uncertain_share(batch, 0.5) == pytest.approx(2 / 5)
    assert row_logr2(new, batch, 0.92) == pytest.approx([(0.01 + 0.25) / 3, 0.0])
    assert uncertain_share(batch, 0.92) == pytest.approx(3 / 5)


def test_a_run_with_the_restricted_statistic_drops_and_logs_its_token_share(tmp_path):
    _, records = run_small(tmp_path, "run.steps=6", "schedule.mode=sync",
                           "schedule.replay_ratio=2", "buffer.horizon=16", "probe.every=0",
                           "eval.every=6", "buffer.drop_logr2=1e-9",
                           "buffer.drop_tokens_below_p=0.9")
    trained = [r for r in records if r.get("dropped") is not None]
    assert len(trained) == 6 and sum(r["dropped"] for r in trained) > 0
    assert all(0 < r["uncertain_share"] <= 1 for r in trained)


@pytest.mark.parametrize("value", [0, -0.5, 1.5, math.nan])
def test_a_bad_bound_is_a_one_line_error(value):
    with pytest.raises(ValueError, match=r"buffer.drop_tokens_below_p must be in \(0, 1\]") \
            as err:
        small_config("buffer.drop_logr2=0.1", "schedule.mode=sync",
                     f"buffer.drop_tokens_below_p={value}")
    assert "\n" not in str(err.value)


def test_the_trl_settings_carry_the_bound_to_the_harness():
    rt = pytest.importorskip("llm_experiments.integrations.trl")
    with pytest.raises(ValueError, match=r"drop_tokens_below_p must be in \(0, 1\]"):
        rt.ReplaySettings(16, 8, drop_logr2=0.05, drop_tokens_below_p=0)
    cfg = rt.ReplaySettings(64, 16, drop_logr2=0.05, drop_tokens_below_p=0.5) \
        .harness_config(8, 4)
    assert cfg.buffer.drop_tokens_below_p == 0.5 and cfg.buffer.drop_logr2 == 0.05
