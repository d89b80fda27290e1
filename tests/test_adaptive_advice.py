"""Whether the advice names the adaptive buffer (replaytheory.adaptive_advice, theory.md 13.2):
the committed adaptive evidence is what the committed grids hold, and the registered rule names
an arm only when it is no worse than x = 64 on every setting and clear of zero on half of them,
once its registered settings are in; the arms are read in their registered order."""

import json

import pytest

from replaytheory.adaptive_advice import (ADAPTIVE_EVIDENCE_PATH, ARMS, AdaptivePair,
                                          choose_adaptive, compare_adaptive)
from replaytheory.advice import advise
from tests.test_advice import _grid

SEEDS = (10, 11, 12, 13, 14)
UNCERTAIN, ALL_TOKENS = ARMS  # read in this order
TAU, MIN_SETTINGS = ALL_TOKENS.tau, ALL_TOKENS.min_settings


def _pair(name, diffs, loss="grpo", tau=TAU, seeds=SEEDS, below_p=1.0):
    """A setting whose adaptive arm is x = 64's per-seed AUC plus ``diffs`` (one per seed)."""
    fixed = {s: 0.5 + 0.01 * ((s * 7) % 5) for s in seeds}
    return AdaptivePair(name, "g", 300, 1e-4, 2.0, loss, tau,
                        {s: fixed[s] + d for s, d in zip(seeds, diffs)}, fixed, below_p)


def _uncertain(name, diffs):
    return _pair(name, diffs, tau=UNCERTAIN.tau, below_p=UNCERTAIN.below_p)


CLEAR = [0.03, 0.05, 0.04, 0.06, 0.05]  # mean 0.046, interval above 0
LEVEL = [0.01, -0.01, 0.02, -0.005, 0.0]  # mean 0.003, interval covers 0


def test_the_committed_adaptive_evidence_is_what_the_committed_grids_hold():
    from replaytheory.evidence import collect_adaptive
    assert collect_adaptive() == json.loads(ADAPTIVE_EVIDENCE_PATH.read_text())


def test_named_when_never_worse_and_clear_of_zero_on_half_the_settings():
    pairs = [_pair(f"s{i}", CLEAR if i < MIN_SETTINGS // 2 else LEVEL)
             for i in range(MIN_SETTINGS)]
    a = choose_adaptive("grpo", False, pairs)
    assert a.named and a.drop_logr2 == TAU and len(a.comparisons) == MIN_SETTINGS
    assert a.comparisons[0].mean == pytest.approx(0.046) and a.comparisons[0].low > 0
    assert a.names(32) == {"drop_logr2": TAU, "drop_tokens_below_p": 1.0,
                           "replay_buffer_size": 1024 * 32}
    assert "interval above 0 on 3" in a.reason


def test_not_named_when_worse_anywhere_clear_too_rarely_or_before_the_registered_settings():
    worse = [_pair(f"s{i}", CLEAR) for i in range(MIN_SETTINGS - 1)] + [
        _pair("bad", [-0.02, -0.01, 0.0, -0.03, -0.01])]
    a = choose_adaptive("grpo", False, worse)
    assert not a.named and "on bad" in a.reason
    rare = [_pair(f"s{i}", CLEAR if i < MIN_SETTINGS // 2 - 1 else LEVEL)
            for i in range(MIN_SETTINGS)]
    assert not choose_adaptive("grpo", False, rare).named
    early = [_pair(f"s{i}", CLEAR) for i in range(MIN_SETTINGS - 1)]
    assert not choose_adaptive("grpo", False, early).named
    assert "registered settings" in choose_adaptive("grpo", False, early).reason


def test_only_grpo_at_the_registered_tau_counts_and_on_policy_gets_none():
    pairs = [_pair(f"s{i}", CLEAR) for i in range(MIN_SETTINGS)]
    others = [_pair("neg", CLEAR, loss="neg_clip"), _pair("loose", CLEAR, tau=0.2)]
    assert {c.setting for c in compare_adaptive(pairs + others, ALL_TOKENS)} == \
        {p.setting for p in pairs}
    assert choose_adaptive("grpo", True, pairs) is None
    assert choose_adaptive("neg_clip", False, pairs) is None
    with pytest.raises(ValueError, match="rollouts_per_step"):
        choose_adaptive("grpo", False, pairs).names(0)


def test_the_advice_carries_the_adaptive_alternative_and_says_why():
    pairs = [_pair(f"s{i}", CLEAR) for i in range(MIN_SETTINGS)]
    buffer_best = [_grid("a", "a", [0.50, 0.52, 0.55, 0.60])]
    a = advise(2.0, 100, evidence=buffer_best, loss_evidence=[], adaptive_evidence=pairs)
    assert a.adaptive is not None and a.adaptive.named
    assert a.provenance["adaptive"].startswith("named")
    assert a.to_dict()["adaptive"]["comparisons"][0]["seeds"] == 5
    on_policy_best = [_grid("a", "a", [0.60, 0.52, 0.50, 0.45])]
    on = advise(2.0, 100, evidence=on_policy_best, loss_evidence=[], adaptive_evidence=pairs)
    assert on.on_policy and on.adaptive is None and "adaptive" not in on.provenance


def test_the_arm_over_uncertain_tokens_is_read_first_and_each_arm_only_on_its_own_runs():
    """Both arms pass: the later registration (over the tokens below 0.5) is the advice's;
    it fails: the first arm's verdict stands and the reason names both."""
    every = [_pair(f"s{i}", CLEAR) for i in range(MIN_SETTINGS)]
    good = [_uncertain(f"u{i}", CLEAR) for i in range(UNCERTAIN.min_settings)]
    a = choose_adaptive("grpo", False, every + good)
    assert a.named and (a.drop_logr2, a.drop_tokens_below_p) == (UNCERTAIN.tau, 0.5)
    assert {c.setting for c in a.comparisons} == {p.setting for p in good}
    assert a.names(8)["drop_tokens_below_p"] == 0.5 and "below 0.5" in a.reason
    bad = good[:-1] + [_uncertain("ubad", [-0.02, -0.01, 0.0, -0.03, -0.01])]
    b = choose_adaptive("grpo", False, every + bad)
    assert b.named and b.drop_tokens_below_p == 1.0 and b.drop_logr2 == TAU
    neither = choose_adaptive("grpo", False, every[:-1] + bad)
    assert not neither.named and neither.drop_tokens_below_p == 0.5
    assert "on ubad" in neither.reason and "registered settings" in neither.reason
