from pathlib import Path

import numpy as np
import pytest

from replaytheory.fit.probes import OPTIONAL_TABLES, SCHEMA, ProbeSet

REPO = Path(__file__).resolve().parents[1]


def example():
    noise = {c: np.arange(4, dtype=float) for c in SCHEMA["noise"]}
    noise["extra"] = np.ones(4)
    return ProbeSet({"noise": noise}, {"unique_rollouts": 100, "samples_consumed": 300,
                                       "workers": 1, "trainers": 1})


@pytest.mark.parametrize("suffix", [".npz", ".jsonl"])
def test_round_trip(tmp_path, suffix):
    p = example()
    path = str(tmp_path / f"probes{suffix}")
    p.save(path)
    q = ProbeSet.load(path)
    assert q.counts == p.counts
    for name in SCHEMA:
        assert set(q.tables[name]) >= set(SCHEMA[name])
        for c in p.tables[name]:
            assert np.allclose(q.tables[name][c], p.tables[name][c])
    assert q.n_rows("noise") == 4 and q.n_rows("bias") == 0


def test_validation_errors():
    bad = {c: np.zeros(3) for c in SCHEMA["noise"]}
    bad["sq_noise"] = np.array([1.0, np.nan, 2.0])
    with pytest.raises(ValueError, match="NaN"):
        ProbeSet({"noise": bad})
    ragged = {c: np.zeros(3) for c in SCHEMA["noise"]}
    ragged["drift"] = np.zeros(2)
    with pytest.raises(ValueError, match="lengths"):
        ProbeSet({"noise": ragged})
    with pytest.raises(ValueError, match="lacks"):
        ProbeSet({"noise": {"staleness": np.zeros(2)}})
    with pytest.raises(ValueError, match="npz or .jsonl"):
        example().save("probes.csv")


def test_extend():
    a, b = example(), example()
    assert a.extend(b).n_rows("noise") == 8


def reuse_rows(n=3):
    table = {c: np.arange(n, dtype=float) + 1 for c in SCHEMA["reuse"]}
    contrib = {c: np.full(n, 0.5) for c in SCHEMA["contribution"]}
    panel = {c: np.arange(n, dtype=float) * 2 for c in SCHEMA["panel"]}
    diversity = {c: np.full(n, 3.0) for c in SCHEMA["diversity"]}
    align = {c: np.arange(n, dtype=float) - 1 for c in SCHEMA["align"]}
    stats = {c: np.linspace(0, 1, n) for c in SCHEMA["align_stats"]}
    pairs = {c: np.arange(n, dtype=float) + 2 for c in SCHEMA["align_pairs"]}
    return {"reuse": table, "contribution": contrib, "panel": panel, "diversity": diversity,
            "align": align, "align_pairs": pairs, "align_stats": stats}


@pytest.mark.parametrize("suffix", [".npz", ".jsonl"])
def test_optional_tables_round_trip(tmp_path, suffix):
    p = example()
    p = ProbeSet({**p.tables, **reuse_rows()}, p.counts)
    path = str(tmp_path / f"probes{suffix}")
    p.save(path)
    q = ProbeSet.load(path)
    for name in OPTIONAL_TABLES:
        assert q.n_rows(name) == 3
        for c, col in p.tables[name].items():
            np.testing.assert_array_equal(q.tables[name][c], col)


def test_files_without_the_optional_tables(tmp_path):
    # a run without the reuse probes writes no arrays for them, and such files load
    path = str(tmp_path / "old.npz")
    example().save(path)
    with np.load(path) as z:
        assert not [k for k in z.files if k.split("/")[0] in OPTIONAL_TABLES]
    q = ProbeSet.load(path)
    assert all(q.n_rows(name) == 0 for name in OPTIONAL_TABLES)
    assert set(q.tables["reuse"]) == set(SCHEMA["reuse"])
    committed = ProbeSet.load(REPO / "results" / "cpu_sweep" / "calibration" / "grpo_seed0.npz")
    assert committed.n_rows("noise") > 0 and committed.n_rows("reuse") == 0
    with pytest.raises(ValueError, match="lacks"):
        ProbeSet({"reuse": {"gap": np.zeros(2)}})
