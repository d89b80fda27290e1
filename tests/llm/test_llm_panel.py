"""Long-range panel probes (probe.panel_groups; theory.md section 11.1) on a small run: the
rows a panel writes at each gap, their identities at birth, and the run left unchanged."""

import os

import numpy as np
import pytest

from llm_helpers import small_config
from llm_experiments.engines.experiment import run_experiment
from llm_experiments.engines.metrics import TIMING_KEYS, read_jsonl
from replaytheory.fit.probes import UNIT_GROUP, UNIT_SEQUENCE, ProbeSet

PANEL = ["probe.panel_groups=3", "probe.panel_births=[0, 2]", "probe.panel_gaps=[1, 3, 6]"]
ARGS = ["run.steps=8", "schedule.mu_accounting=2.0"]


@pytest.fixture(scope="module")
def panel_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("runs") / "panel")
    run_experiment(small_config(*ARGS, *PANEL), out)
    return out, ProbeSet.load(os.path.join(out, "probes.npz"))


def test_panel_rows_at_each_gap(panel_run):
    _, ps = panel_run
    p = ps.tables["panel"]
    seq = p["unit"] == UNIT_SEQUENCE
    # Births at 0 and 2; gaps 1, 3, 6 within the 8 steps (2 + 6 = 8 is past the run).
    pairs = set(zip(p["birth_step"][seq].astype(int), p["gap"][seq].astype(int)))
    assert pairs == {(0, 0), (0, 1), (0, 3), (0, 6), (2, 0), (2, 1), (2, 3)}
    assert np.all(p["probe_step"] == p["birth_step"] + p["gap"])
    g = 4  # small_config's group size
    per = seq & (p["birth_step"] == 0) & (p["gap"] == 3)
    assert per.sum() == 3 * g and (~seq & (p["birth_step"] == 0) & (p["gap"] == 3)).sum() == 3


def test_panel_at_birth_is_its_own_reference(panel_run):
    """At gap 0 the noise 'then' is the noise now: inner = sq, contribution 1, no clip."""
    _, ps = panel_run
    p = ps.tables["panel"]
    birth = p["gap"] == 0
    assert np.allclose(p["inner_birth"][birth], p["sq_noise"][birth], rtol=1e-5)
    assert np.allclose(p["sq_birth"][birth], p["sq_noise"][birth])
    assert np.all(p["clip_fraction"][birth] == 0)
    assert np.allclose(p["contribution"][birth], 1.0, atol=1e-5)
    later = p["gap"] > 0
    cs = np.abs(p["inner_birth"][later]) / np.sqrt(p["sq_noise"][later] * p["sq_birth"][later])
    assert np.all(cs <= 1 + 1e-6)  # Cauchy-Schwarz


def test_diversity_rows_match_the_panel(panel_run):
    _, ps = panel_run
    d, p = ps.tables["diversity"], ps.tables["panel"]
    assert ps.n_rows("diversity") == 7
    for t, b, mean_sq in zip(d["probe_step"], d["birth_step"], d["mean_sq"]):
        rows = (p["probe_step"] == t) & (p["birth_step"] == b) & (p["unit"] == UNIT_SEQUENCE)
        assert np.isclose(mean_sq, p["sq_noise"][rows].mean(), rtol=1e-6)
    assert np.all(d["group_size"] == 4) and np.all(d["n_groups"] == 3)
    # The panel's bias rows (method 2) are one per measurement.
    b = ps.tables["bias"]
    assert (b["method"] == 2).sum() == 7


def test_panels_leave_the_run_unchanged(panel_run, tmp_path):
    out, _ = panel_run
    plain = str(tmp_path / "plain")
    run_experiment(small_config(*ARGS), plain)

    def strip(path):
        return [{k: v for k, v in r.items() if k not in TIMING_KEYS}
                for r in read_jsonl(os.path.join(path, "metrics.jsonl"))]
    assert strip(out) == strip(plain)


def test_panel_config_ranges():
    with pytest.raises(ValueError, match="probe.panel_groups"):
        small_config("probe.panel_groups=2", "trainer.loss=asymre")
    with pytest.raises(ValueError, match="schedule.engine=emulated"):
        small_config("probe.panel_groups=2", "schedule.engine=ray", "schedule.mode=async")
    with pytest.raises(ValueError, match=r"probe.panel_gaps\[0\]"):
        small_config("probe.panel_gaps=[0]")
