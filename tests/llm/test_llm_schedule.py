import pytest

from llm_experiments.config import load_config
from llm_experiments.rl.schedule import ComputeClock, Production


def test_non_integer_replay_ratio_is_exact_on_average():
    sc = load_config("cpu_tiny", ["schedule.replay_ratio=1.4", "schedule.batch_size=64",
                                  "schedule.group_size=8"]).schedule
    prod = Production(sc)
    due = [prod.groups_due(t) for t in range(70)]
    assert set(due) == {5, 6}  # 64 / 1.4 = 45.7 rollouts = 5.71 groups per step
    assert sum(due) * 8 == 70 * 64 / 1.4  # after 70 steps: replay ratio exactly 1.4
    assert all(abs(sum(due[:t]) * 8 * 1.4 - 64 * t) < 8 * 1.4 for t in range(1, 70))
    assert all(prod.version(t) == t for t in range(5))


def test_on_policy_and_async_rates():
    on = Production(load_config("cpu_tiny", ["schedule.mode=on_policy"]).schedule)
    assert on.rollouts_per_step == 64 and on.groups_due(3) == 8
    sc = load_config("cpu_tiny", ["schedule.mode=async", "schedule.workers=2",
                                  "schedule.trainers=2", "schedule.mu_accounting=4",
                                  "schedule.refresh_every=3"]).schedule
    prod = Production(sc, mu=4.0)
    # B W / (T mu) = 64 * 2 / (2 * 4) = 16 rollouts = 2 groups per step;
    # expected replay ratio mu T / W = 4 (theory.md section 3).
    assert prod.rollouts_per_step == 16 and sc.batch_size / prod.rollouts_per_step == 4
    assert prod.latency == 8  # round(mu T)
    assert [prod.version(t) for t in (0, 8, 10, 11, 12, 14)] == [0, 0, 0, 3, 3, 6]


def test_compute_clock():
    clock = ComputeClock(n_params=1000, batch_size=10)
    assert clock.mu_time() is None and clock.compute_units(None) is None
    clock.generated, clock.gen_seconds, clock.gen_tokens = 40, 2.0, 400
    clock.steps, clock.train_seconds, clock.train_tokens = 8, 4.0, 800
    # 10 rollouts take 0.5 s, one update 0.5 s
    assert clock.mu_time() == pytest.approx(1.0)
    # FLOPs: 2 * 100 tokens for 10 rollouts vs 6 * 100 tokens per update
    assert clock.mu_flops() == pytest.approx(200 / 600)
    assert clock.compute_units(6.84) == pytest.approx(8 + 6.84 * 4)
    back = ComputeClock(1, 1)
    back.load_state_dict(clock.state_dict())
    assert back.mu_time() == clock.mu_time()
