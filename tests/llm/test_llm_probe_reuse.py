"""The reuse and contribution probes (probe.reuse_gaps, probe.contribution; theory.md section
8.9) on a small run: tables present, values sane, and the run itself unchanged."""

import os

import numpy as np
import pytest

from llm_helpers import small_config
from llm_experiments.engines.experiment import run_experiment
from llm_experiments.engines.metrics import TIMING_KEYS, read_jsonl
from replaytheory.fit.diagnosis import self_correlation
from replaytheory.fit.probes import UNIT_GROUP, UNIT_SEQUENCE, ProbeSet

# Every probe sees the whole buffer (16 groups of 4), so the group rows of a reuse row's
# earlier step are in the noise table of that earlier probe.
ARGS = ["run.steps=10", "probe.every=3", "probe.buffer_groups=16", "schedule.mu_accounting=2.0"]
REUSE = ["probe.reuse_gaps=[1, 2]", "probe.contribution=true"]


@pytest.fixture(scope="module")
def reuse_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("runs") / "reuse")
    run_experiment(small_config(*ARGS, *REUSE), out)
    return out, ProbeSet.load(os.path.join(out, "probes.npz"))


def test_reuse_rows(reuse_run):
    _, ps = reuse_run
    r = ps.tables["reuse"]
    assert ps.n_rows("reuse") > 0
    assert set(np.unique(r["gap"])) == {3, 6}
    assert np.all(r["staleness"] >= r["gap"])  # only rollouts that existed at t - g
    assert np.all(r["sq_now"] > 0) and np.all(r["sq_then"] > 0)
    assert np.all(np.abs(r["inner"]) <= np.sqrt(r["sq_now"] * r["sq_then"]) * (1 + 1e-6))
    fit = self_correlation(ps, min_probes=1, n_boot=20)
    for est in fit.corr:
        assert np.isfinite(est.value) and -1 <= est.value <= 1


def test_reuse_then_is_the_earlier_probe_noise(reuse_run):
    """sq_then of a group row is that group's noise measured by the probe g steps earlier
    (its weights and its reference gradient), found in the noise table."""
    _, ps = reuse_run
    r, n = ps.tables["reuse"], ps.tables["noise"]
    grp = (r["unit"] == UNIT_GROUP)
    assert grp.any()
    for t, g, s, sq in zip(r["probe_step"][grp], r["gap"][grp], r["staleness"][grp],
                           r["sq_then"][grp]):
        then = (n["probe_step"] == t - g) & (n["staleness"] == s - g) & \
            (n["unit"] == UNIT_GROUP) & (n["source"] == 0)
        assert np.min(np.abs(n["sq_noise"][then] - sq) / sq) < 1e-4, (t, g, s)


def test_contribution_rows(reuse_run):
    _, ps = reuse_run
    c = ps.tables["contribution"]
    assert ps.n_rows("contribution") > 0
    assert np.all((c["clip_fraction"] >= 0) & (c["clip_fraction"] <= 1))
    assert np.all(c["is_weight"] > 0) and np.all(np.isfinite(c["contribution"]))
    fresh = (c["staleness"] == 0) & (c["uses"] == 0)
    assert fresh.any() and (c["staleness"] > 0).any()
    # a fresh sample is on-policy: ratio 1, nothing clipped, its whole gradient kept
    np.testing.assert_allclose(c["contribution"][fresh], 1.0, atol=1e-6)
    np.testing.assert_allclose(c["is_weight"][fresh], 1.0, atol=1e-4)
    assert np.all(c["clip_fraction"][fresh] == 0)
    # where tokens are clipped, the clipped loss drops part of the gradient
    clipped = (c["clip_fraction"] > 0) & (c["sq_unclip"] > 0) & (c["unit"] == UNIT_SEQUENCE)
    assert clipped.any() and np.any(np.abs(c["contribution"][clipped] - 1) > 1e-3)


def test_noise_uses_and_the_run_unchanged(reuse_run, tmp_path):
    out, ps = reuse_run
    n = ps.tables["noise"]
    buffer = n["source"] == 0
    assert np.all(n["uses"][~buffer] == 0) and n["uses"][buffer].max() > 0
    plain = str(tmp_path / "plain")
    run_experiment(small_config(*ARGS), plain)
    strip = [{k: v for k, v in rec.items() if k not in TIMING_KEYS}
             for rec in read_jsonl(os.path.join(out, "metrics.jsonl"))]
    base = [{k: v for k, v in rec.items() if k not in TIMING_KEYS}
            for rec in read_jsonl(os.path.join(plain, "metrics.jsonl"))]
    assert strip == base  # the new probes never perturb training
    # and with them off, the probes are those of before (no rows, no arrays in the file)
    with np.load(os.path.join(plain, "probes.npz")) as z:
        assert not [k for k in z.files if k.startswith(("reuse/", "contribution/"))]


def test_config_ranges():
    with pytest.raises(ValueError, match=r"probe.reuse_gaps\[0\]"):
        small_config("probe.reuse_gaps=[0]")
    with pytest.raises(ValueError, match="probe.contribution"):
        small_config("probe.contribution=true", "trainer.loss=asymre")
