import pytest

from llm_experiments.config import (Config, differences, from_dict, load_config, parse_override,
                                    read_config, save_config)


def test_shipped_configs_load():
    tiny = load_config("cpu_tiny")
    assert tiny.model.name == "tiny" and tiny.run.device == "cpu" and tiny.run.threads == 1
    q = load_config("qwen3_0p6b_math")
    assert (q.model.name, q.schedule.group_size, q.schedule.batch_size) == \
        ("Qwen/Qwen3-0.6B", 16, 60)
    assert q.trainer.lr == pytest.approx(3.37e-7) and q.trainer.optimizer == "adam"
    assert q.sampler.temperature == 1.0 and q.eval.temperature == pytest.approx(0.1)


def test_overrides_are_typed():
    cfg = load_config("cpu_tiny", ["trainer.lr=3e-4", "buffer.lifo=true",
                                   "probe.crn_staleness=[2, 5]", "schedule.replay_ratio=1.4"])
    assert cfg.trainer.lr == 3e-4 and cfg.buffer.lifo is True
    assert cfg.probe.crn_staleness == [2, 5] and cfg.schedule.replay_ratio == 1.4
    assert parse_override("task.name=math") == ("task", "name", "math")


@pytest.mark.parametrize("override, message", [
    ("trainer.lrr=1", "unknown config key trainer.lrr"),
    ("trainr.lr=1", "unknown config section 'trainr'"),
    ("trainer.lr=abc", "trainer.lr must be a real number"),
    ("trainer.lr=-1", "trainer.lr must be in (0, inf)"),
    ("run.steps=2.5", "run.steps must be an integer"),
    ("buffer.delta=1.0", "buffer.delta must be in [0, 1)"),
    ("buffer.sampling=random", "buffer.sampling must be one of"),
    ("run.progress=maybe", "run.progress must be true or false"),
    ("schedule.mode=async", "needs schedule.mu_accounting"),
    ("trainer", "--set expects section.key=value"),
    ("lr=1", "--set key must be section.key"),
])
def test_bad_input_names_the_key(override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        load_config("cpu_tiny", [override])


def test_cross_checks():
    with pytest.raises(ValueError, match="divisible by schedule.trainers"):
        load_config("cpu_tiny", ["schedule.trainers=3"])
    with pytest.raises(ValueError, match="buffer.capacity per shard"):
        load_config("cpu_tiny", ["buffer.capacity=8", "buffer.sampling=without_replacement"])
    with pytest.raises(ValueError, match="neither a YAML file nor a shipped config"):
        load_config("no_such_config")


def test_yaml_round_trip_and_differences(tmp_path):
    cfg = load_config("cpu_tiny", ["trainer.lr=2e-4"])
    save_config(cfg, str(tmp_path / "c.yaml"))
    back = read_config(str(tmp_path / "c.yaml"))
    assert back == cfg
    assert differences(back, Config()) == [k for k in differences(cfg, Config())]
    assert "trainer.lr" in differences(cfg, from_dict({}))
    assert cfg.section_hash("model", "task") == back.section_hash("model", "task")


def test_buffer_horizon_sets_capacity():
    from llm_experiments.config import load_config
    c = load_config("cpu_tiny", ["buffer.horizon=4", "schedule.replay_ratio=1.4"])
    assert c.buffer.capacity == round(4 * 64 / 1.4)
    c = load_config("cpu_tiny", ["buffer.horizon=4", "schedule.mode=async", "schedule.workers=6",
                                 "schedule.trainers=2", "schedule.mu_accounting=6.84"])
    assert c.buffer.capacity % 2 == 0 and abs(c.buffer.capacity - 4 * 64 * 6 / 13.68) <= 2
    with pytest.raises(ValueError, match="buffer.horizon"):
        load_config("cpu_tiny", ["buffer.horizon=-1"])
