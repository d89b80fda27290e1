"""The Ray engine's arithmetic (``llm_experiments/engines/ray_plan.py``), without a cluster:
exact resource shares, the placement bundles built from them, and the smallest LIFO queue
that cannot deadlock, checked against a search over the driver's dispatch orders."""

from math import floor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_helpers import import_extra, small_config

from llm_experiments.engines.ray_plan import (RESOLUTION, chunk_groups, lifo_min_capacity,
                                              packed_shares, shares)

RAY = ["schedule.engine=ray", "schedule.mode=async", "probe.every=0"]


def units(amount: float) -> int:
    """An amount in Ray's fixed-point units (nearest, as a float k / 10000 stands for k)."""
    return round(amount / RESOLUTION)


def assert_ray_accepts(share: float) -> None:
    """Ray takes an amount above 1 only whole, and below 1 in steps of RESOLUTION."""
    assert share >= 0
    if share > 1:
        assert share == int(share), share
    else:
        assert abs(share / RESOLUTION - units(share)) < 1e-6, share


@settings(max_examples=500, deadline=None)
@given(total=st.integers(0, 64) | st.integers(1, 640_000).map(lambda u: u * RESOLUTION),
       parts=st.integers(1, 40), cap=st.integers(1, 16))
def test_shares_never_ask_more_than_the_cluster_holds(total, parts, cap):
    got = shares(total, parts, cap)
    assert len(got) == parts
    for s in got:
        assert_ray_accepts(s)
        assert s <= cap
    assert sum(units(s) for s in got) <= units(total)
    fair = min(cap, total / parts)
    if fair < 1:  # split to the unit: all of the total, within one unit of each other
        assert sum(units(s) for s in got) == units(total)
        assert max(map(units, got)) - min(map(units, got)) <= 1
    else:
        assert got == [float(floor(fair))] * parts


@pytest.mark.parametrize("total, parts, want", [
    (2, 3, [0.6667, 0.6667, 0.6666]),  # the issue's case: round() asked for 2.0001
    (2, 2, [1.0, 1.0]), (1, 3, [0.3334, 0.3333, 0.3333]), (5, 3, [1.0, 1.0, 1.0]),
    (16, 3, [4.0, 4.0, 4.0]), (0.3, 4, [0.075] * 4), (0.0003, 4, [0.0001] * 3 + [0.0]),
])
def test_shares_examples(total, parts, want):
    assert shares(total, parts, 4) == want


@pytest.mark.parametrize("workers, trainers", [(w, t) for w in range(1, 6) for t in (1, 2, 4)])
@pytest.mark.parametrize("cpus", [1, 2, 3, 7, 16])
def test_bundles_fit_the_cluster(workers, trainers, cpus):
    """One bundle per actor, CPUs that sum to at most the cluster's, each at most
    run.threads, each an amount Ray accepts."""
    import_extra("ray", "ray")
    from llm_experiments.engines.ray_engine import bundles
    cfg = small_config(*RAY, f"schedule.workers={workers}", f"schedule.trainers={trainers}",
                       "run.threads=2")
    got = bundles(cfg, {"CPU": float(cpus)})
    assert len(got) == workers + trainers
    assert sum(units(b["CPU"]) for b in got) <= units(cpus)
    for b in got:
        assert_ray_accepts(b["CPU"])
        assert 0 < b["CPU"] <= 2


def test_bundles_on_gpus_are_exact_too():
    import_extra("ray", "ray")
    from llm_experiments.engines.ray_engine import bundles
    cfg = small_config(*RAY, "schedule.workers=2", "run.device=cuda")
    got = bundles(cfg, {"CPU": 2.0, "GPU": 1.0})
    assert [b["GPU"] for b in got] == [0.3334, 0.3333, 0.3333]
    with pytest.raises(ValueError, match="has 0 GPUs for 3 actors"):
        bundles(cfg, {"CPU": 2.0})


def first_fit(bins, sizes) -> bool:
    """Whether ``sizes`` go into ``bins`` whole, largest first (in Ray's units)."""
    room = sorted((units(b) for b in bins), reverse=True)
    for size in sorted(map(units, sizes), reverse=True):
        k = next((i for i, r in enumerate(room) if r >= size), None)
        if k is None:
            return False
        room[k] -= size
    return True


@settings(max_examples=500, deadline=None)
@given(bins=st.lists(st.integers(1, 16).map(float) | st.sampled_from([1.0, 0.5, 0.25]),
                     min_size=2, max_size=6),
       parts=st.integers(1, 20), cap=st.integers(1, 8))
def test_packed_shares_place_whole_bundles_in_the_bins(bins, parts, cap):
    """Issue 38 N5: on several GPUs or nodes every bundle fits one of them whole; and no
    larger equal share would."""
    got = packed_shares(bins, parts, cap)
    assert len(got) == parts and len(set(got)) == 1
    s = got[0]
    assert_ray_accepts(s)
    assert s <= cap
    if s > 0:
        assert first_fit(bins, got)
    bigger = (units(s) + (10_000 if s >= 1 else 1)) * RESOLUTION
    assert bigger > cap or not first_fit(bins, [bigger] * parts)


def test_two_gpus_for_three_actors_give_half_a_gpu_each():
    """The issue's case: W = 2, T = 1 on 2 GPUs asked 0.6667 GPU each, and only one such
    bundle fits a GPU; 1 / ceil(3 / 2) = 0.5 each packs two on one GPU, one on the other.
    CPUs on two 1-CPU nodes likewise."""
    assert packed_shares([1.0, 1.0], 3, 1.0) == [0.5] * 3
    assert packed_shares([1.0] * 4, 3, 1.0) == [1.0] * 3
    assert packed_shares([2.0], 3, 1.0) == shares(2, 3, 1.0)  # one bin: the exact split
    cfg = small_config(*RAY, "schedule.workers=2", "run.device=cuda", "run.threads=1")
    got = bundles_of(cfg, {"CPU": 2.0, "GPU": 2.0}, [1.0, 1.0])
    assert [b["GPU"] for b in got] == [0.5] * 3 and [b["CPU"] for b in got] == [0.5] * 3


def bundles_of(cfg, total, node_cpus):
    import_extra("ray", "ray")
    from llm_experiments.engines.ray_engine import bundles
    return bundles(cfg, total, node_cpus)


def stuck_reachable(batch: int, chunk: int, capacity: int, workers: int) -> bool:
    """Whether the Ray driver's LIFO dispatch can reach a deadlock, searched over every order
    of events: a chunk lands (held += chunk) or a trainer step takes a batch (held >= batch);
    after each, idle samplers start chunks while held + in flight + chunk <= capacity. Stuck:
    no chunk in flight and fewer than a batch held."""
    def dispatch(held, flying):
        while flying < workers and held + (flying + 1) * chunk <= capacity:
            flying += 1
        return held, flying

    seen, todo = set(), [dispatch(0, 0)]
    while todo:
        held, flying = state = todo.pop()
        if state in seen:
            continue
        seen.add(state)
        if flying == 0 and held < batch:
            return True
        if flying:
            todo.append(dispatch(held + chunk, flying - 1))
        if held >= batch:
            todo.append(dispatch(held - batch, flying))
    return False


def test_lifo_min_capacity_is_exactly_where_deadlocks_stop():
    """The closed form C >= B + n - gcd(n, B) against the search, over many (B, n, C, W)."""
    checked = 0
    for group in (2, 3, 4, 8):
        for batch in range(group, 49, group):
            for groups in range(1, 7):
                chunk = groups * group
                least = lifo_min_capacity(batch, chunk)
                for capacity in range(batch, least + 2 * group + 1):
                    for workers in (1, 2, 3, 8):
                        assert stuck_reachable(batch, chunk, capacity, workers) == \
                            (capacity < least), (batch, chunk, capacity, workers)
                        checked += 1
    assert checked > 10_000


def test_the_deadlocking_lifo_config_is_refused_naming_the_fields():
    """The issue's run (B = 20, G = 4, W = 2: chunks of 8, capacity 20) stopped with 16 held
    and every sampler waiting; its config is now refused at once, naming the cause."""
    assert chunk_groups(20, 2, 4) * 4 == 8 and lifo_min_capacity(20, 8) == 24
    issue = [*RAY, "schedule.workers=2", "schedule.batch_size=20", "buffer.lifo=true"]
    with pytest.raises(ValueError) as err:
        small_config(*issue, "buffer.capacity=20")
    msg = str(err.value)
    for part in ("buffer.capacity (20) must be >= 24", "buffer.lifo=true",
                 "schedule.engine=ray", "schedule.workers 2", "schedule.group_size 4",
                 "deadlock", "buffer.capacity=24"):
        assert part in msg, msg
    assert small_config(*issue, "buffer.capacity=24").buffer.capacity == 24
    # Two trainers: the suggestion is a multiple of them; the emulated engine is not refused.
    with pytest.raises(ValueError, match="e.g. buffer.capacity=24"):
        small_config(*issue, "schedule.trainers=2", "buffer.capacity=22")
    small_config("schedule.mode=async", "schedule.mu_accounting=2", "schedule.workers=2",
                 "schedule.batch_size=20", "buffer.lifo=true", "buffer.capacity=20")
