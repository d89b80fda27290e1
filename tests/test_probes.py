import numpy as np
import pytest

from replaytheory.probes import SCHEMA, ProbeSet


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
