"""IdTable and IntRing against plain dict / deque models."""

from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from replaytheory.columns import IdTable, IntRing


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(1, 20), st.booleans()), max_size=60))
def test_id_table_matches_a_dict(ops):
    table, model, next_id = IdTable({"a": np.int64, "b": np.float32}), {}, 0
    rng = np.random.default_rng(0)
    for insert, n, shuffle in ops:
        if insert:
            ids = np.arange(next_id, next_id + n)
            if shuffle:  # out of order: sorted back on insert
                ids = rng.permutation(ids)
            next_id += n
            table.insert(ids, a=ids * 3, b=0.5)
            model.update({int(i): int(i) * 3 for i in ids})
        elif model:
            gone = rng.choice(sorted(model), min(n, len(model)), replace=False)
            table.delete(gone)
            for i in gone:
                del model[int(i)]
        assert len(table) == len(model)
        held = table.ids[table.live_rows()]
        assert held.tolist() == sorted(model)
        if model:
            keys = np.array(sorted(model))
            assert table.cols["a"][table.rows(keys)].tolist() == [model[k] for k in keys]
        assert not table.contains([next_id + 5])[0]


def test_id_table_errors_and_reinsertion():
    t = IdTable({"a": np.int64})
    t.insert([1, 2, 3], a=[10, 20, 30])
    with pytest.raises(KeyError):
        t.rows([4])
    t.delete([2])
    assert t.contains([1, 2, 3]).tolist() == [True, False, True]
    t.insert([2], a=99)  # a deleted id may come back
    assert t.cols["a"][t.rows([1, 2, 3])].tolist() == [10, 99, 30]


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.integers(0, 2), max_size=200))
def test_int_ring_matches_a_deque(ops):
    ring, model = IntRing([5, 6]), deque([5, 6])
    for k, op in enumerate(ops):
        if op == 0:
            ring.append(k)
            model.append(k)
        elif model:
            assert (ring.popleft() if op == 1 else ring.pop()) == \
                (model.popleft() if op == 1 else model.pop())
        assert len(ring) == len(model) and ring.array().tolist() == list(model)
    with pytest.raises(IndexError):
        IntRing().pop()
