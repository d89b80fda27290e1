"""The verdict of experiments/seconds_equal.yaml (llm_experiments.study.verdicts.seconds_equal):
the buffer's ratio by hand when its run is as long in seconds as on-policy's, and EQ1-EQ2."""

import pytest
from test_seconds_long import _run, _write

from llm_experiments.study.verdicts import seconds_equal as eq

ON, ADVICE = (1, 1), (64, 2.0)


def _runs(buffer_accs, seeds=(0, 1, 2, 3, 4), extra_seed=None):
    """mu 3: on-policy 100 updates at 4 s (evaluations at 0, 200, 400 s; 0.3, 0.5, 0.7), the
    buffer 160 updates at 2.5 s (0, 200, 400 s)."""
    runs = []
    for seed in seeds:
        runs += [_run(4, ON, seed, 3.0, [0.3, 0.5, 0.7]),
                 _run(4, ADVICE, seed, 3.0, buffer_accs, steps=160)]
    if extra_seed is not None:
        runs.append(_run(4, ADVICE, extra_seed, 3.0, buffer_accs, steps=160))
    return runs


def test_the_ratio_by_hand_and_the_claims(tmp_path):
    """On-policy's target 0.6 falls at 300 s; the buffer (0.3, 0.7, 0.8) reaches it at
    200 * 0.3 / 0.4 = 150 s: ratio 0.5 on every seed. The buffer-only seed 5 is left out."""
    v = eq.judge(_write(tmp_path, _runs([0.3, 0.7, 0.8], extra_seed=5)))
    level = v["levels"]["4"]
    assert level["seeds"] == [0, 1, 2, 3, 4] and v["complete"]
    assert level["cells"]["x=64, y=2"]["ratio"] == pytest.approx((0.5,) * 3)
    assert v["claims"] == {"EQ1": True, "EQ2": True}
    assert level["ends"]["x=64, y=2"]["seconds_over_on_policy"] == pytest.approx((1.0,) * 3)
    assert level["costs"]["x=64, y=2"]["update"] == pytest.approx(1.0)
    assert level["costs"]["on-policy"]["rollout"] == pytest.approx(3.0 / 64)


def test_a_buffer_that_falls_short_on_one_seed_fails_eq1(tmp_path):
    """Seed 4's buffer ends at 0.55, below the 0.6 target: its ratio is inf."""
    runs = _runs([0.3, 0.5, 0.65], seeds=(0, 1, 2, 3))
    runs += [_run(4, ON, 4, 3.0, [0.3, 0.5, 0.7]),
             _run(4, ADVICE, 4, 3.0, [0.3, 0.5, 0.55], steps=160)]
    v = eq.judge(_write(tmp_path, runs))
    cell = v["levels"]["4"]["cells"]["x=64, y=2"]
    assert cell["reached"] == 4 and v["claims"] == {"EQ1": False, "EQ2": False}


def test_another_level_is_refused_in_one_line(tmp_path):
    runs = [_run(0, ON, 0, 3.0, [0.3, 0.5, 0.7])]
    with pytest.raises(ValueError, match=r"seconds_equal runs at sampler.max_concurrent=4"):
        eq.judge(_write(tmp_path, runs))


def test_the_table_shows_the_costs_and_the_claims(tmp_path):
    import json

    from figures.cpu_long import seconds as fig
    res = tmp_path / "res"
    res.mkdir()
    (res / "verdict.json").write_text(json.dumps(eq.judge(_write(res, _runs([0.3, 0.7, 0.8])))))
    fig.main(["--grid", "seconds_equal", "--results", str(res), "--out", str(tmp_path / "out")])
    text = (tmp_path / "out" / "seconds_equal.md").read_text()
    assert "| x=64, y=2 | 1.000 | 0.0469 |" in text and "* EQ1 (" in text
