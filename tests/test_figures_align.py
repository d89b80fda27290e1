"""align(g) by phase (figures.align, theory.md 11.15) from saved align probes: a table row per
birth and a pooled row, with the known align read back."""

import json

import numpy as np

from figures import align
from test_align_fit import synthetic_rows
from replaytheory.fit.probes import ProbeSet


def test_the_align_table_reads_back_each_phase(tmp_path):
    truth = {(0, 0): 1.0, (0, 16): 0.5, (100, 0): 1.0, (100, 16): 0.95}
    for run in (0, 1):
        rows = synthetic_rows(truth, np.random.default_rng(run), noise=0.05)
        rows.pop("run")
        folder = tmp_path / "runs" / f"seed={run}"
        folder.mkdir(parents=True)
        ProbeSet(tables={"align": {c: np.array(v, float) for c, v in rows.items()}}).save(
            str(folder / "probes.npz"))
    paths = align.main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out")])
    fit = json.loads((tmp_path / "out" / "align.json").read_text())
    assert np.allclose(fit["by_birth"]["0"]["value"], [1.0, 0.5], atol=0.03)
    assert np.allclose(fit["by_birth"]["100"]["value"], [1.0, 0.95], atol=0.03)
    text = (tmp_path / "out" / "align.md").read_text()
    assert "| 0 | 1.00" in text and "| 100 |" in text and "| pooled |" in text
    assert "2 runs" in text and len(paths) == 4


def test_the_development_check_pairs_each_window_with_its_registered_verdict():
    """The committed development check (theory.md 11.15) covers the 14 windows at 3 mus, and
    the unscored windows are those registered before they were scored (27 cases)."""
    text = align.devcheck_table(align.DEVCHECK, align.windows.WINDOWS)
    assert text.count("| unscored |") == 27 and text.count("| dev |") == 15
    assert "**Windows unscored at registration:** 27 cases" in text
