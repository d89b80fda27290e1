"""The window table (figures.windows, theory.md 11.12) reads every judged window and counts the
goal's criteria over the unscored windows apart (predicted after the curves existed: none is a
blind test)."""

from figures import windows


def _case(**kw):
    base = dict(setting="s", steps=50, unscored=True, mu="measured", best=8.0, neighbours="",
                x_phases=16.0, x_one=1.0, regret={k: 0.1 for k in windows.READOUTS},
                spearman=0.8)
    return windows.WindowCase(**{**base, **kw})


def test_summary_counts_within_a_factor_two_and_spearman():
    cases = [_case(), _case(x_phases=17.0, spearman=0.5), _case(x_phases=4.0, x_one=4.0)]
    text = windows.summary(cases)
    assert text.startswith("3 cases: model x* within 2x of the best horizon in 2 (one phase: 1)")
    assert "Spearman >= 0.7 in 2" in text


def test_committed_windows_load_with_unscored_windows_and_development_checks_apart(tmp_path):
    cases = windows.load_cases()
    assert cases, "results/windows holds judged windows"
    assert {c.mu for c in cases} == set(windows.MUS)
    unscored = [c for c in cases if c.unscored]
    assert 0 < len(unscored) < len(cases)
    # the whole-run windows were judged before: never counted as unscored
    assert not any(c.unscored for c in cases if (c.setting, c.steps) in
                   {("cpu_sweep_v3", 300), ("horizon_short", 100)})
    paths = windows.main(["--out", str(tmp_path)])
    assert (tmp_path / "windows.md").read_text().count("| unscored |") == len(unscored)
    assert len(paths) == 3
