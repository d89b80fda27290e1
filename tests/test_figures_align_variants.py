"""align(g) under three losses (figures.align_variants, theory.md 11.16) from saved align
probes with variant rows and chunk statistics: each loss's align and the paired changes read
back, per birth and pooled, and the chunk statistics averaged per gap."""

import json

import numpy as np
import pytest

from figures import align_variants
from test_align_fit import synthetic_rows
from replaytheory.fit.probes import SCHEMA, ProbeSet


def _stats(truth: dict, chunks=16) -> dict:
    """align_stats rows: a clip fraction of gap / 100 and a mean ratio of 1 + gap / 1000."""
    rows = {c: [] for c in SCHEMA["align_stats"]}
    for birth, gap in truth:
        for k in range(chunks):
            for c, v in dict(probe_step=birth + gap, birth_step=birth, gap=gap, chunk=k,
                             clip_fraction=gap / 100, is_ess=1.0, approx_kl=0.0,
                             mean_ratio=1 + gap / 1000, n_seq=4).items():
                rows[c].append(v)
    return {c: np.array(v, float) for c, v in rows.items()}


def test_three_losses_and_their_changes_read_back(tmp_path):
    truth = {(0, 0): 1.0, (0, 4): 1.5, (100, 0): 1.0, (100, 4): 1.2}
    shifts = {"unclipped": 0.2, "ratio_one": -0.5}
    for run in (0, 1):
        pairs = {}
        rows = synthetic_rows(truth, np.random.default_rng(run), noise=0.05, variants=shifts,
                              pairs=pairs)
        rows.pop("run"), pairs.pop("run")
        folder = tmp_path / "runs" / f"seed={run}"
        folder.mkdir(parents=True)
        ProbeSet(tables={"align": {c: np.array(v, float) for c, v in rows.items()},
                         "align_pairs": {c: np.array(v, float) for c, v in pairs.items()},
                         "align_stats": _stats(truth)}).save(str(folder / "probes.npz"))
    paths = align_variants.main(["--runs", str(tmp_path / "runs"), "--out",
                                 str(tmp_path / "out"), "--name", "moments"])
    got = json.loads((tmp_path / "out" / "moments.json").read_text())
    by_birth = got["align"]["ratio = 1"]["by_birth"]
    assert np.allclose(by_birth["0"]["value"], [0.5, 1.0], atol=0.03)
    assert np.allclose(by_birth["100"]["value"], [0.5, 0.7], atol=0.03)
    assert np.allclose(got["change"]["unclipped"]["pooled"]["value"], 0.2, atol=0.03)
    assert np.allclose(got["change"]["ratio_one"]["100"]["value"], -0.5, atol=0.03)
    assert got["chunk_stats"]["pooled"]["4"]["clip_fraction"] == pytest.approx(0.04)
    assert got["chunk_stats"]["100"]["4"]["mean_ratio"] == pytest.approx(1.004)
    # the panel's mean is (align + shift) grad F: bias (1 - align - shift)^2, nothing off it
    bias = got["moments"]["ratio = 1"]["by_birth"]["100"]["bias"]["value"]
    assert np.allclose(bias, [0.25, 0.09], atol=0.03)
    assert np.allclose(got["moments"]["unclipped"]["orthogonal"]["value"], 0, atol=0.03)
    text = (tmp_path / "out" / "moments.md").read_text()
    assert "| ratio = 1 | 0.50" in text and "2 runs" in text and len(paths) == 4
    assert "| unclipped | pooled |" in text and "16 chunks" in text


def test_the_committed_variant_runs_reproduce_the_align_runs():
    """theory.md 11.16's registered check 0: the training loss's and the reference's rows of
    results/horizon_align_ratio equal results/horizon_align_large's, bit for bit, at every
    measurement the two share (same runs, seeds and code path)."""
    from figures import align
    results = align.RUNS.parents[1]
    for seed in (2, 3):
        new, old = (ProbeSet.load(str(next((results / name / "runs").glob(
            f"seed={seed}_*/probes.npz")))).tables["align"]
            for name in ("horizon_align_ratio", "horizon_align_large"))

        def keyed(t):
            cols = ("probe_step", "birth_step", "part", "chunk", "other")
            return {tuple(t[c][i] for c in cols): t["value"][i]
                    for i in range(len(t["value"])) if t["part"][i] in (0, 1)}
        a, b = keyed(new), keyed(old)
        shared = set(a) & set(b)
        assert len(shared) == 22_800
        assert all(a[k] == b[k] for k in shared)
