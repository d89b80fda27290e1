"""``predict`` then ``verify`` end to end on a tiny budget (the commands of issue 10)."""

import json
import os

import pytest

from llm_helpers import CACHE, SMALL

pytestmark = pytest.mark.slow


def _overrides():
    out = {}
    for text in SMALL:
        key, value = text.split("=", 1)
        out[key] = value
    out.update({"run.steps": "12", "probe.fresh_groups": "8", "eval.every": "6"})
    return out


def test_predict_writes_a_registration_that_brackets_every_prediction(tmp_path):
    from llm_experiments.study.judge import Registration
    from llm_experiments.study.predict import make_prediction
    from llm_experiments.study.validation import VARIANTS
    pred = make_prediction("cpu_tiny", _overrides(), str(tmp_path / "p"), steps=12,
                           horizon=4, seeds=1, workers=1, progress=False)
    saved = json.loads((tmp_path / "p" / "prediction.json").read_text())
    assert saved == json.loads(json.dumps(pred))
    assert set(pred["predictions_judged"]) == set(VARIANTS)  # the reuse probes are on
    assert pred["primary_variant"] in VARIANTS
    assert pred["measured_mu"] > 0
    # the advice from measurement is registered beside the model's, at every mu judged
    from replaytheory.advice import advise
    assert set(pred["advice"]) == set(pred["predictions_judged"]["asymptotic"])
    assert pred["advice"]["6.84"] == json.loads(json.dumps(advise(6.84, 12).to_dict()))
    for by_mu in pred["predictions_judged"].values():
        assert len(by_mu) == 3  # the measured mu, 2 and 6.84
        for xy in by_mu.values():
            if isinstance(xy, list):  # else the reason the variant has no optimum
                assert min(pred["horizons"]) <= max(xy[0], 1) <= max(pred["horizons"])
                assert min(pred["replay_ratios"]) <= max(xy[1], 1) <= max(pred["replay_ratios"])
    reg = Registration.load(str(tmp_path / "p" / "prediction.json"))
    assert reg.budget_replay_ratio == max(pred["replay_ratios"])

    # verify on a shrunk grid (the plumbing, not the science): 2 seeds x 3 cells
    pred.update({"horizons": [4], "replay_ratios": [1.0, 2.0],
                 "learning_rates": [1e-3], "secondary_targets": [0.2]})
    pred["bootstrap"]["draws"] = 20
    pred["set"]["run.cache_dir"] = CACHE
    (tmp_path / "p" / "prediction.json").write_text(json.dumps(pred))
    from llm_experiments.study.verify import main, verify
    records = verify(str(tmp_path / "p" / "prediction.json"), str(tmp_path / "v"), seeds=2,
                     workers=1, progress=False)
    assert os.path.exists(tmp_path / "v" / "validation.json")
    auc = [r for r in records if r["measure"] == "auc"]
    assert {r["mu_source"] for r in auc} == {"measured", "2", "6.84", "cell"}
    for r in auc:
        assert [c["label"] for c in r["cells"]] == ["on-policy", "x=4, y=1", "x=4, y=2"]
        assert r["seeds_per_cell"] == [2, 2, 2]
        assert r["best_cell"] in ("on-policy", "x=4, y=1", "x=4, y=2")
    # a second call finds every run done and reproduces the verdicts
    again = verify(str(tmp_path / "p" / "prediction.json"), str(tmp_path / "v"), seeds=2,
                   workers=1, progress=False)
    assert json.dumps(again) == json.dumps(records)
    # another machine, holding only the committed curves, reruns nothing and judges the same
    import shutil
    committed = tmp_path / "committed_curves.jsonl"
    shutil.copy(tmp_path / "v" / "curves.jsonl", committed)
    elsewhere = verify(str(tmp_path / "p" / "prediction.json"), str(tmp_path / "w"), seeds=2,
                       workers=1, progress=False, done_in=(str(committed),))
    assert not any((tmp_path / "w" / "runs" / "runs").iterdir())

    def without_curves(recs):
        return [{k: v for k, v in r.items() if k != "curves"} for r in recs]
    assert without_curves(elsewhere) == without_curves(records)
    # the registration names its calibration's initial policy; runs from another are refused
    assert len(pred["warm_start"]["warm_start_sha256"]) == 64
    from llm_experiments.study.judge import judge
    foreign = dict(pred, warm_start={"warm_start_sha256": "0" * 64, "warm_start_accuracy": -1})
    (tmp_path / "p" / "prediction_foreign.json").write_text(json.dumps(foreign))
    with pytest.raises(ValueError, match="another policy than the registration's calibration"):
        judge(str(committed), Registration.load(str(tmp_path / "p" / "prediction_foreign.json")),
              None)
    with pytest.raises(SystemExit) as refused:  # the gate needs two halves of the seeds
        main(["--prediction", str(tmp_path / "p" / "prediction.json"), "--out",
              str(tmp_path / "v"), "--seeds", "1"])
    assert refused.value.code == 2


def test_predict_names_the_variants_capped_by_the_measured_staleness():
    # heldout_digits3's registration: every variant but finite_eta put x* = 16, the edge of a
    # 16-step calibration buffer, and lost to x = 64 (theory.md section 10.9).
    from llm_experiments.study.predict import at_measured_edge
    preds = {"asymptotic": {"0.53": [16.0, 2.0], "2": [16.0, 2.8]},
             "finite_eta": {"0.53": [1.0, 1.0], "2": "no optimum"},
             "self_correlated": {"0.53": [12.0, 1.0], "2": [15.9, 1.4]}}
    assert at_measured_edge(preds, 16.0) == ["asymptotic"]
    assert at_measured_edge(preds, 12.0) == ["asymptotic", "self_correlated"]
    assert at_measured_edge(preds, 64.0) == []


def test_a_second_registration_extrapolates_on_the_same_grid(tmp_path):
    # heldout_digits3's committed calibration: noise falls with staleness, every capped x* is
    # the 16-step edge; "hold_last" lets the horizon search past it (theory.md section 4.6).
    import shutil
    from llm_experiments.study.judge import Registration
    from llm_experiments.study.predict import UNBOUNDED_HORIZON, extrapolated_registration, main
    from llm_experiments.study.verify import validation_name
    src = os.path.join(os.path.dirname(__file__), "..", "..", "results", "heldout_digits3")
    shutil.copytree(os.path.join(src, "calibration"), tmp_path / "calibration",
                    ignore=shutil.ignore_patterns("logs"))
    shutil.copy(os.path.join(src, "prediction.json"), tmp_path / "prediction.json")
    path = extrapolated_registration(str(tmp_path / "prediction.json"), "hold_last",
                                     primary="self_correlated", note="test")
    assert os.path.basename(path) == "prediction_hold_last.json"
    first = json.loads((tmp_path / "prediction.json").read_text())
    second = json.loads((tmp_path / "prediction_hold_last.json").read_text())
    for field in ("horizons", "replay_ratios", "learning_rates", "primary_measure", "set"):
        assert second[field] == first[field]
    assert second["primary_variant"] == "self_correlated"
    assert second["supplements"] == "prediction.json"
    plan = second["planned_verification"]
    assert plan["primary_variant"] == "self_correlated"
    assert "--prediction results/heldout_digits3/prediction_hold_last.json" in plan["command"]
    capped = first["predictions_judged"]["self_correlated"]
    held = second["predictions_judged"]["self_correlated"]
    assert set(held) == set(capped)
    for key in capped:
        assert capped[key][0] == 16.0 and held[key][0] == UNBOUNDED_HORIZON
    reg = Registration.load(path)
    assert reg.extrapolate == "hold_last" and Registration.load(
        str(tmp_path / "prediction.json")).extrapolate == "none"
    assert validation_name(path) == "validation_hold_last.json"
    assert validation_name(str(tmp_path / "prediction.json")) == "validation.json"
    with pytest.raises(ValueError, match="extrapolate must be one of"):
        extrapolated_registration(path, "linear")
    with pytest.raises(SystemExit):  # --from and --out are two different jobs
        main(["--from", path, "--out", str(tmp_path)])


def test_a_registration_without_its_own_config_or_calibration_folder_names_both(tmp_path):
    # cpu_sweep_v2's registrations name neither: their probes are results/diagnosis.
    import shutil
    from llm_experiments.study.predict import extrapolated_registration
    src = os.path.join(os.path.dirname(__file__), "..", "..", "results", "heldout_digits3")
    shutil.copytree(os.path.join(src, "calibration"), tmp_path / "probes",
                    ignore=shutil.ignore_patterns("logs"))
    reg = json.loads(open(os.path.join(src, "prediction.json")).read())
    config = reg.pop("config")
    (tmp_path / "prediction.json").write_text(json.dumps(reg))
    with pytest.raises(ValueError, match="names no config"):
        extrapolated_registration(str(tmp_path / "prediction.json"), "hold_last",
                                  calibration=str(tmp_path / "probes"))
    path = extrapolated_registration(str(tmp_path / "prediction.json"), "hold_last",
                                     calibration=str(tmp_path / "probes"), config=config)
    held = json.loads(open(path).read())["predictions_judged"]["self_correlated"]
    committed = json.loads(open(os.path.join(src, "prediction.json")).read())
    assert set(held) == set(committed["predictions_judged"]["self_correlated"])
