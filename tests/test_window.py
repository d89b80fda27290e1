"""The finite-run horizon model (theory.md section 11.12): its long-run limit is section 11.5's
J_h, a buffer that has not filled is the same at every horizon, and a later phase whose
rollouts keep their worth moves the best horizon out as the run grows."""

import glob
import json
import os

import numpy as np
import pytest

from replaytheory.model import horizon as hz
from replaytheory.model import window as wn


def _terms(n=129, decay=0.01, g=8, r=0.1):
    s = np.arange(n, dtype=float)
    return hz.HorizonTerms(sigma2=100 + 0.1 * s, corr=0.9 * np.exp(-s / 20),
                           corr_mate=np.where(s < 4, 0.05, 0.0), within=np.full(n, r),
                           worth=np.exp(-decay * s), group_size=g, measured_gap=n - 1)


def test_long_run_limit_is_the_steady_state_objective():
    terms = _terms()
    tab = wn.step_tables(wn.single_phase(terms), 20000)
    for mu in (0.5, 6.84):
        x, y = np.array([1, 2, 8, 16]), np.array([1.0, 0.5, 2.0, 4.0])
        steady = hz.objective(terms, x, y, mu=mu) / hz.on_policy(terms, mu=mu)
        # y_max = 4 sets the budget alike for every design, so it drops out of the ratio
        got = wn.objective(tab, x, y, mu=mu, y_max=4.0)
        np.testing.assert_allclose(got, steady, rtol=2e-3)


def test_a_buffer_that_has_not_filled_is_the_same_at_every_longer_horizon():
    tab = wn.step_tables(wn.single_phase(_terms()), 30)
    j = wn.objective(tab, [30, 64, 128], 1.0, mu=2.0, y_max=4.0)
    assert j[0] == j[1] == j[2]
    assert wn.objective(tab, 8, 1.0, mu=2.0, y_max=4.0) != j[0]


def test_rollouts_that_keep_their_worth_late_move_the_best_horizon_out_with_the_run():
    early, late = _terms(decay=0.08), _terms(decay=0.002)
    phased = wn.PhasedTerms(births=(0.0, 60.0), terms=(early, late))
    short = wn.optimal_design(wn.step_tables(phased, 60), mu=6.84, y_max=4.0)
    long = wn.optimal_design(wn.step_tables(phased, 600), mu=6.84, y_max=4.0)
    assert long.horizon >= 2 * short.horizon
    # one phase with the early terms: the run's length alone moves it less
    alone = wn.optimal_design(wn.step_tables(wn.single_phase(early), 600), mu=6.84, y_max=4.0)
    assert long.horizon > alone.horizon


def test_on_policy_score_is_the_auc_weighted_update_count():
    # n_on = T (1 + mu / y_max) / (1 + mu) = 50 * 1.25 / 2 = 31.25 updates in the budget:
    # sum_{t=0}^{31} (1 - t / 31.25) = 32 - 496 / 31.25
    assert wn.on_policy_score(50, mu=1.0, y_max=4.0) == pytest.approx(32 - 496 / 31.25)
    tab = wn.step_tables(wn.single_phase(_terms()), 50)
    cells = wn.objective_at_cells(tab, [1, 8, 16], [1.0, 1.0, 2.0], mu=1.0, y_max=4.0,
                                  on_policy_cell=0)
    assert cells[0] == 1.0
    np.testing.assert_allclose(cells[1:], wn.objective(tab, [8, 16], [1.0, 2.0], mu=1.0,
                                                       y_max=4.0))
    d = wn.optimal_design(tab, mu=0.1, y_max=4.0, max_horizon=32)
    assert d.horizon <= 32


@pytest.mark.parametrize("kwargs, word", [
    ({"births": (10.0, 0.0)}, "births"),
    ({"births": (0.0,), "terms": ()}, "births and terms"),
])
def test_bad_phases_are_named(kwargs, word):
    t = _terms()
    args = {"births": (0.0, 10.0), "terms": (t, t), **kwargs}
    with pytest.raises(ValueError, match=word):
        wn.PhasedTerms(**args)


def test_bad_cells_are_named():
    tab = wn.step_tables(wn.single_phase(_terms()), 20)
    with pytest.raises(ValueError, match="horizon"):
        wn.objective(tab, 1000, 1.0, mu=1.0, y_max=4.0)
    with pytest.raises(ValueError, match="replay_ratio"):
        wn.objective(tab, 8, 5.0, mu=1.0, y_max=4.0)
    with pytest.raises(ValueError, match="steps"):
        wn.step_tables(wn.single_phase(_terms()), 0)


def test_panels_are_grouped_into_phases_of_two_panels():
    from test_horizon import synthetic_panels
    from llm_experiments.study.window_predict import born_in, phase_fits, phase_groups
    probes = synthetic_panels(n_panels=5)  # one panel born at each of 0, 100, ..., 400
    assert phase_groups(probes) == [(0.0, 100.0), (200.0, 300.0, 400.0)]
    assert set(born_in(probes, (200.0,)).tables["panel"]["birth_step"]) == {200.0}
    fits = phase_fits(probes, n_boot=20)
    assert [p.birth for p in fits] == [50.0, 300.0]
    assert [p.fit.n_panels for p in fits] == [2, 3]


def test_a_window_needs_a_run_at_least_that_long():
    from llm_experiments.study.window_predict import register
    with pytest.raises(ValueError, match="--steps must be in"):
        register({"steps": 100, "horizons": [1, 2]}, 101, [], name="w")


WINDOWS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "results", "windows",
                                        "*", "prediction.json")))


@pytest.mark.parametrize("path", WINDOWS[::4], ids=lambda p: p.split(os.sep)[-2])
def test_a_window_registration_rebuilds_its_prediction(path):
    """The judge scores a window registration's cells with the model rebuilt from the phase
    fits it holds: it gives back the registered optimum."""
    with open(path) as fh:
        reg = json.load(fh)
    hm = reg["horizon_model"]
    longest = int(max(reg["horizons"]))
    phased, one = wn.registered_window(hm, longest)
    y_max = float(reg["primary_measure"]["budget_replay_ratio"])
    for key, by in hm["by_mu"].items():
        mu = float(key) if float(key) in reg["accounting_mus"] else reg["measured_mu"]
        for variant, model in (("horizon", phased), ("horizon_one_phase", one)):
            d = wn.optimal_design(wn.step_tables(model, reg["steps"]), mu=mu, y_max=y_max,
                                  max_horizon=longest)
            assert d.horizon == by[variant]["horizon"]
            assert d.objective == pytest.approx(by[variant]["objective"], rel=1e-12)


def test_a_window_names_a_bad_worth():
    from llm_experiments.study.window_predict import register
    with pytest.raises(ValueError, match="--worth must be one of"):
        register({"steps": 100, "horizons": [1, 2]}, 50, [], name="w", worth="signal")


def test_the_worth_a_registration_names_is_the_one_rebuilt():
    path = next(p for p in WINDOWS if "cpu_sweep_v3_T150" in p)
    with open(path) as fh:
        hm = json.load(fh)["horizon_model"]
    kept, _ = wn.registered_window(hm, 64)
    assert "worth" not in hm["window"]  # registered before the choice existed: the kept share
    assert kept.terms[0].worth[4] < 1
    # with 32-group references the alignment is not resolved (theory.md 11.12): said, not used
    with pytest.raises(ValueError, match="non-positive align"):
        wn.registered_window({**hm, "window": {**hm["window"], "worth": "align"}}, 64)


ALIGN_RUNS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "results",
                                           "horizon_align_large", "runs", "*")))


def test_large_align_panels_replace_each_phases_align_with_the_nearest_birth():
    """``with_align``: a phase takes the align curve of the align birth nearest its own, the
    pooled fit the pooled curve; without align panels the fit is untouched."""
    from replaytheory.fit.align_fit import fit_align
    from llm_experiments.study.validation import load_probes
    from llm_experiments.study.window_predict import with_align
    from test_horizon import synthetic_panels
    from llm_experiments.study.window_predict import phase_fits
    align = fit_align(load_probes([os.path.join(d, "probes.npz") for d in ALIGN_RUNS]),
                      n_boot=20)
    assert sorted(align.by_birth) == [0, 50, 100, 150, 200]
    fit = phase_fits(synthetic_panels(n_panels=2), n_boot=20)[0].fit
    assert with_align(fit, 0.0, None) is fit
    assert with_align(fit, 120.0, align).align == align.by_birth[100]
    assert with_align(fit, 180.0, align).align == align.by_birth[200]
    assert with_align(fit, None, align).align == align.pooled
    assert with_align(fit, 120.0, align).sigma2 == fit.sigma2


def test_align_runs_need_the_align_worth():
    from llm_experiments.study.window_predict import register
    with pytest.raises(ValueError, match="--align-runs needs --worth align"):
        register({"steps": 100, "horizons": [1, 2]}, 50, [], name="w", worth="kept",
                 align_dirs=ALIGN_RUNS)


def test_align_runs_that_match_nothing_name_the_option(capsys, tmp_path):
    from llm_experiments.study.window_predict import main
    base = next(p for p in WINDOWS if "horizon_g4_T30" in p)
    code = main(["--base", base, "--steps", "30", "--panels", str(tmp_path), "--name", "w",
                 "--worth", "align", "--align-runs", str(tmp_path / "none*"),
                 "--out", str(tmp_path / "out")])
    assert code == 2 and "--align-runs matches no run folder" in capsys.readouterr().err
