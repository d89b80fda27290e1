"""The replicate-split ceiling of G3 (llm_experiments.study.verdicts.g3_ceiling) on small
synthetic grids: noiseless cells never fail, pure-noise cells fail often, the halves are
disjoint and of the stated sizes, the full-seed check catches a changed score, and a bad
--splits is a one-line error."""

import json
from pathlib import Path

import numpy as np
import pytest

from llm_experiments.study.verdicts import g3_ceiling as g3
from replaytheory.advice import Evidence
from replaytheory.stats.analysis import best_option

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "fixtures" / "tiny_sweep" / "curves.jsonl"
LABELS = ("on-policy", "x=64, y=1", "x=4, y=1", "x=16, y=2", "x=1, y=1")
X = (1.0, 64.0, 4.0, 16.0, 1.0)
Y = (1.0, 1.0, 1.0, 2.0, 1.0)
OWN_CHOICE, OWN_BEST, RULE, ON_POLICY = range(4)


def synthetic_case(true, noise: float, seeds: int, seed: int = 0, lrs: int = 2,
                   on_policy: bool = True, key: str = "grid") -> g3.CeilingCase:
    """A case at mu = 0.5 (the rule's cell x=64, y=1) whose (cells, lrs, seeds) AUC is
    ``true`` per cell (the second lr 0.05 worse) plus seed noise: the same normal draws of sd
    ``noise`` in each cell, in its own order, so that the cells' noise is independent seed by
    seed but the full-seed scores keep the order of ``true`` (a split cannot find a signal
    the whole table does not hold)."""
    keep = slice(None) if on_policy else slice(1, None)
    true = np.asarray(true, float)[keep]
    rng = np.random.default_rng(seed)
    draws = noise * rng.normal(size=seeds)
    noisy = np.stack([[rng.permutation(draws) for _ in range(lrs)] for _ in true])
    table = true[:, None, None] - np.array([0.0, 0.05])[None, :lrs, None] + noisy
    e = Evidence("synthetic", "synthetic", 100, 0.5, 0.2, LABELS[keep], np.array(X[keep]),
                 np.array(Y[keep]), best_option(table, "max")[0])
    return g3.CeilingCase(e, "measured", table, tuple(range(seeds)), key)


@pytest.mark.parametrize("true", [(0.6, 0.5, 0.4, 0.45, 0.3), (0.5, 0.6, 0.4, 0.45, 0.3),
                                  (0.5, 0.45, 0.4, 0.6, 0.55), (0.4, 0.5, 0.6, 0.3, 0.3)])
@pytest.mark.parametrize("seeds", [5, 10])
def test_without_seed_noise_the_own_half_choices_never_fail(true, seeds):
    (o,) = g3.ceiling([synthetic_case(true, 0.0, seeds)], splits=30)
    assert not o.fails[:, OWN_CHOICE].any() and not o.fails[:, OWN_BEST].any()
    assert np.all(o.regret[:, OWN_BEST] == 0.0) and np.all(o.agree)
    # the rule fails exactly where on-policy beats it
    assert o.fails[:, RULE].all() == (true[0] > true[1])


def test_pure_noise_cells_fail_often_and_a_and_b_agree_no_better_than_chance():
    """Cells alike up to seed noise: a half's best cell is noise, so it often loses to the
    rule or on-policy on the other half (halves of one sample are negatively dependent:
    A and B agree on rule against on-policy less than half the time)."""
    case = synthetic_case((0.5,) * 5, 0.05, 10)
    (o,) = g3.ceiling([case], splits=200)
    share = o.fails.mean(axis=0)
    assert share[OWN_CHOICE] > 0.3 and share[OWN_BEST] > 0.5
    assert o.agree.mean() < 0.6
    # the choice between rule and on-policy fails only where A and B disagree
    assert np.all(o.fails[:, OWN_CHOICE] <= ~o.agree)


def test_without_an_on_policy_cell_the_rule_is_chosen_and_never_fails():
    (o,) = g3.ceiling([synthetic_case((0.5,) * 5, 0.05, 5, on_policy=False)], splits=50)
    assert o.agree is None
    for arm in (OWN_CHOICE, RULE, ON_POLICY):
        assert not o.fails[:, arm].any()
    assert np.array_equal(o.regret[:, OWN_CHOICE], o.regret[:, RULE])


@pytest.mark.parametrize("n", [2, 5, 10, 11])
def test_halves_are_disjoint_of_the_stated_sizes_and_reproducible(n):
    h = g3.halves(n, 100, g3.split_rng("grid", 0))
    assert h.a.shape == (100, n // 2) and h.b.shape == (100, n - n // 2)
    for a, b in zip(h.a, h.b):
        assert not set(a) & set(b) and sorted([*a, *b]) == list(range(n))
    again = g3.halves(n, 100, g3.split_rng("grid", 0))
    assert np.array_equal(h.a, again.a) and np.array_equal(h.b, again.b)
    if n > 2:
        other = g3.halves(n, 100, g3.split_rng("grid", 1))
        assert not np.array_equal(h.a, other.a)


def test_cases_of_one_grid_share_their_splits_and_other_grids_do_not():
    """Two cases reading the same curves (``key``) are halved alike, as a replicate of the
    grid would share its seeds; another grid's cases are halved independently."""
    same = [synthetic_case((0.5,) * 5, 0.05, 10, key=k) for k in ("g", "g", "h")]
    first, twin, other = g3.ceiling(same, splits=100)
    assert np.array_equal(first.regret, twin.regret)
    assert not np.array_equal(first.regret, other.regret)


def test_summary_counts_failing_cases_per_split():
    fails = np.zeros((4, 4), bool)
    fails[0, OWN_CHOICE] = fails[1, OWN_CHOICE] = True
    a = g3.CaseOutcome(np.zeros((4, 4)), fails, None)
    b = g3.CaseOutcome(np.ones((4, 4)), np.roll(fails, 1, axis=0), None)
    s = {x.arm: x for x in g3.summarise([a, b])}[g3.ARMS[OWN_CHOICE]]
    # failing cases per split: 1, 2, 1, 0
    assert s.fails_mean == 1.0 and s.p_all_pass == 0.25 and s.mean_regret_b == 0.5
    assert s.cases == 2 and s.fails_min == 0 and s.fails_p05 == pytest.approx(0.15)
    assert s.fails_p95 == pytest.approx(1.85)


def _committed(tmp_path) -> Path:
    """A results folder holding the tiny sweep judged as window T = 24, and its evidence."""
    from llm_experiments.study.judge import Registration, judge
    from replaytheory.evidence import collect
    from replaytheory.io import write_json
    reg = {"name": "t", "loss": "grpo", "steps": 24, "horizons": [1, 4],
           "replay_ratios": [1, 2], "accounting_mus": [2.0],
           "primary_measure": {"budget_replay_ratio": 2}, "secondary_targets": [],
           "bootstrap": {"draws": 20, "interval": 0.9, "rng_seed": 0},
           "gate": {"threshold": 0.9}, "predictions_judged": {}}
    results = tmp_path / "results"
    folder = results / "windows" / "tiny_T24"
    folder.mkdir(parents=True)
    (folder / "prediction.json").write_text(json.dumps(reg))
    records = judge(str(FIXTURE), Registration.load(str(folder / "prediction.json")), None)
    write_json(str(folder / "validation.json"), records)
    (tmp_path / "evidence.json").write_text(json.dumps(collect(results)))
    return results


def test_the_judges_scores_are_recomputed_and_a_changed_one_is_caught(tmp_path):
    results = _committed(tmp_path)
    cases = g3.load_cases(tmp_path / "evidence.json", results)
    assert [c.mu_source for c in cases] == ["measured", "2"]
    assert all(c.full_seed_gap <= 1e-12 and c.seeds == (0, 1, 2, 3) for c in cases)
    doc = g3.report(cases, g3.ceiling(cases, splits=60), 60, 0)
    assert doc["sanity"]["max_full_seed_gap"] <= 1e-12
    assert {c["half_sizes"] == [2, 2] for c in doc["cases"]} == {True}
    assert {c["distinct_splits"] for c in doc["cases"]} == {6}  # C(4, 2): every halving
    path = results / "windows" / "tiny_T24" / "validation.json"
    records = json.loads(path.read_text())
    records[0]["cells"][1]["score"] += 1e-6
    path.write_text(json.dumps(records))
    with pytest.raises(ValueError, match="differs from the committed one"):
        g3.load_cases(tmp_path / "evidence.json", results)


@pytest.mark.parametrize("bad", ["0", "-3", "two"])
def test_bad_splits_is_a_one_line_error_naming_the_parameter(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exc:
        g3.main(["--out", str(tmp_path / "c.json"), "--splits", bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--splits" in err and ">= 1" in err
    with pytest.raises(ValueError, match="splits must be an integer >= 1"):
        g3.ceiling([], splits=0)


def test_the_rule_against_on_policy_interval_is_paired_by_seed_at_the_best_rate():
    """The rule's cell minus on-policy, per seed at each cell's best learning rate: with a
    shared seed effect much larger than the gap, pairing still resolves a gap of 0.1; a gap
    of 0 covers 0; without on-policy there is none; the summary counts each kind."""
    rng = np.random.default_rng(1)
    seed_effect = rng.normal(0, 0.2, size=8)
    true = np.array([0.5, 0.6, 0.4, 0.45, 0.3])
    table = true[:, None, None] - np.array([0.0, 0.05])[None, :, None] + seed_effect + \
        rng.normal(0, 0.01, size=(5, 2, 8))
    e = Evidence("s", "s", 100, 0.5, 0.2, LABELS, np.array(X), np.array(Y),
                 best_option(table, "max")[0])
    gap = g3.rule_against_on_policy(g3.CeilingCase(e, "measured", table, tuple(range(8)), "k"))
    assert 0.07 < gap.low < gap.mean < gap.high < 0.13 and gap.seeds == 8
    tie = synthetic_case((0.5,) * 5, 0.05, 10)
    none = synthetic_case((0.5,) * 5, 0.05, 5, on_policy=False)
    assert g3.rule_against_on_policy(none) is None
    t = g3.rule_against_on_policy(tie)
    assert t.low <= 0 <= t.high
    summary = g3.gap_summary([g3.rule_against_on_policy(c) for c in (
        g3.CeilingCase(e, "measured", table, tuple(range(8)), "k"), tie, none)])
    assert summary == {"cases": 2, "level": 0.95, "covers_zero": 1, "rule_better": 1,
                       "on_policy_better": 0}


def test_the_advice_figure_reports_the_committed_ceiling():
    """figures.advice's section of the ceiling reads the committed report: each arm's row
    and the rule-against-on-policy count; nothing without a report."""
    from figures.advice import CEILING, ceiling_section
    doc = json.loads(CEILING.read_text())
    text = ceiling_section(doc)
    assert all(f"| {a['arm']} | {a['fails_mean']:.1f}" in text for a in doc["arms"])
    g = doc["rule_against_on_policy"]
    assert f"covers 0 in {g['covers_zero']} of {g['cases']}" in text
    a = doc["advice_left_out"]
    assert f"worse than the rule in {a['worse_than_rule']} of {a['cases']}" in text
    assert ceiling_section({}) == ""


def test_the_advices_losses_are_counted_on_points_and_beyond_the_paired_interval():
    """The advice at the rule's cell loses nothing; at a cell 0.1 below the rule's, with a
    shared seed effect, it loses beyond the interval; at a cell equal to the rule's up to
    seed noise, a point loss may show but none beyond the interval. On-policy counts only
    where it beats the rule."""
    rng = np.random.default_rng(2)
    true = np.array([0.5, 0.6, 0.5, 0.45, 0.3])  # on-policy, rule (64, 1), (4, 1), ...
    table = true[:, None, None] - np.array([0.0, 0.05])[None, :, None] + \
        rng.normal(0, 0.2, size=10) + rng.normal(0, 0.005, size=(5, 2, 10))
    e = Evidence("s", "s", 100, 0.5, 0.2, LABELS, np.array(X), np.array(Y),
                 best_option(table, "max")[0])
    clear = g3.CeilingCase(e, "measured", table, tuple(range(10)), "k")
    got = g3.advice_losses([clear, clear], [(64.0, 1.0), (4.0, 1.0)])
    assert got["worse_than_rule"] == 1 and got["worse_than_rule_beyond_interval"] == 1
    assert got["on_policy_beats_rule"] == 0 and got["worse_than_on_policy_there"] == 0
    noise = synthetic_case((0.6, 0.5, 0.5, 0.5, 0.5), 0.05, 5)  # on-policy beats the rule
    got = g3.advice_losses([noise], [(4.0, 1.0)])
    assert got["on_policy_beats_rule"] == 1
    assert got["worse_than_rule_beyond_interval"] <= got["worse_than_rule"]
    assert got["worse_than_on_policy_there_beyond_interval"] <= \
        got["worse_than_on_policy_there"] == 1
