"""The verdict of experiments/seconds_late.yaml (llm_experiments.study.verdicts.seconds_late):
early and late AUC over seconds by hand, and LT1-LT3 read from them."""

import pytest
from test_seconds_long import _run, _write

from llm_experiments.study.verdicts import seconds_late as lt

ON, ADVICE, ADAPTIVE = (1, 1), (64, 2.0), (1024, 2.0)


def _adaptive(seed, accs):
    run = _run(4, ADAPTIVE, seed, 3.0, accs)
    run["settings"]["buffer.drop_logr2"] = 0.1
    return run


def test_a_buffer_that_catches_up_late_by_hand(tmp_path):
    """mu 3: on-policy spends 4 s an update (evaluations at 0, 200, 400 s; accuracy 0.3, 0.5,
    0.7), x = 64, y = 2 spends 2.5 s (0, 125, 250 s; 0.3, 0.4, 0.7). B = 250 s. On-policy's
    mean accuracy is 0.3625 over [0, 125] s and 0.4875 over [125, 250] s, the buffer's 0.35 and
    0.55: early -0.0125, late +0.0625, gap +0.075. On-policy's target (0.5 + 0.7) / 2 = 0.6
    falls at 300 s, the buffer's at 125 + 125 * 2/3 = 208.3 s: ratio 0.694."""
    runs = []
    for seed in (0, 1, 2):
        runs += [_run(4, ON, seed, 3.0, [0.3, 0.5, 0.7]),
                 _run(4, ADVICE, seed, 3.0, [0.3, 0.4, 0.7]),
                 _adaptive(seed, [0.3, 0.3, 0.4])]
    v = lt.judge(_write(tmp_path, runs))
    level = v["levels"]["4"]
    assert level["budget_seconds"] == pytest.approx(250.0)
    h = level["halves"]["x=64, y=2"]
    assert h["early_minus_on_policy"] == pytest.approx((-0.0125,) * 3)
    assert h["late_minus_on_policy"] == pytest.approx((0.0625,) * 3)
    assert h["late_minus_early"] == pytest.approx((0.075,) * 3)
    assert level["cells"]["x=64, y=2"]["ratio"] == pytest.approx((0.6944,) * 3, abs=1e-4)
    assert "on-policy" not in level["halves"] and "x=1024, y=2, adaptive" in level["halves"]
    assert v["claims"] == {"LT1": True, "LT2": True, "LT3": False} and not v["complete"]


def test_a_buffer_that_falls_behind_late_fails_lt1_and_lt2(tmp_path):
    """The buffer leads early (0.5 at 125 s against on-policy's 0.425) and stalls (0.5 at
    250 s, below the 0.6 target): the gap is negative and the ratio infinite."""
    runs = []
    for seed in (0, 1):
        runs += [_run(4, ON, seed, 3.0, [0.3, 0.5, 0.7]),
                 _run(4, ADVICE, seed, 3.0, [0.3, 0.5, 0.5])]
    v = lt.judge(_write(tmp_path, runs))
    level = v["levels"]["4"]
    assert level["halves"]["x=64, y=2"]["late_minus_early"][0] < 0
    assert level["cells"]["x=64, y=2"]["reached"] == 0
    assert v["claims"] == {"LT1": False, "LT2": False, "LT3": False}


def test_two_levels_are_refused_in_one_line(tmp_path):
    runs = [_run(level, ON, 0, 3.0, [0.3, 0.5, 0.7]) for level in (0, 4)]
    with pytest.raises(ValueError, match=r"one level of sampler.max_concurrent, got \[0, 4\]"):
        lt.judge(_write(tmp_path, runs))


def test_the_table_shows_the_halves_and_the_claims(tmp_path):
    import json

    from figures.cpu_long import seconds as fig
    runs = []
    for seed in (0, 1, 2, 3, 4):
        runs += [_run(4, ON, seed, 3.0, [0.3, 0.5, 0.7]),
                 _run(4, ADVICE, seed, 3.0, [0.3, 0.4, 0.7])]
    res = tmp_path / "res"
    res.mkdir()
    (res / "verdict.json").write_text(json.dumps(lt.judge(_write(res, runs))))
    paths = fig.main(["--grid", "seconds_late", "--results", str(res), "--out",
                      str(tmp_path / "out")])
    text = (tmp_path / "out" / "seconds_late.md").read_text()
    assert "| x=64, y=2 | -0.013 [-0.013, -0.013] | +0.063 [+0.063, +0.063] | " \
           "+0.075 [+0.075, +0.075] |" in text
    assert "* LT1 (" in text and "holds" in text and "INTERIM" not in text
    assert {p.suffix for p in paths} >= {".md", ".png"}


def test_where_the_runs_end_by_hand(tmp_path):
    """As the first test: the buffer's run takes 250 s of on-policy's 400 (0.625); its final
    accuracy (0.4 + 0.7) / 2 = 0.55 is 0.05 below on-policy's 0.6, and 0.0 above on-policy's
    0.55 at 250 s."""
    runs = []
    for seed in (0, 1):
        runs += [_run(4, ON, seed, 3.0, [0.3, 0.5, 0.7]),
                 _run(4, ADVICE, seed, 3.0, [0.3, 0.4, 0.7])]
    e = lt.judge(_write(tmp_path, runs))["levels"]["4"]["ends"]["x=64, y=2"]
    assert e["seconds_over_on_policy"] == pytest.approx((0.625,) * 3)
    assert e["final_minus_on_policy_final"] == pytest.approx((-0.05,) * 3)
    assert e["final_minus_on_policy_same_seconds"] == pytest.approx((0.0,) * 3, abs=1e-12)
