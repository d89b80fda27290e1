import dataclasses
import subprocess
import sys

import pytest

from llm_experiments.config import (SECTIONS, Config, differences, from_dict, load_config,
                                    parse_override, read_config, save_config)


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
    ("trainer.lr=abc", "trainer.lr must be in (0, inf); got 'abc', not a real number"),
    ("trainer.lr=-1", "trainer.lr must be in (0, inf)"),
    ("run.steps=2.5", "run.steps must be an integer >= 1, got 2.5"),
    ("run.steps=abc", "run.steps must be an integer >= 1, got 'abc'"),
    ("run.steps=-5", "run.steps must be an integer >= 1, got -5"),
    ("task.digits=10", "task.digits must be an integer in [1, 9], got 10"),
    ("eval.pass_k=[1, 0]", "eval.pass_k[1] must be an integer >= 1, got 0"),
    ("run.device=gpu", "run.device must be 'cpu', 'cuda' or 'cuda:N'"),
    ("buffer.delta=1.0", "buffer.delta must be in [0, 1)"),
    # issue 38: a horizon under one step (a buffer smaller than one step's rollouts)
    ("buffer.horizon=0.5", "buffer.horizon (or 0) must be in [1, inf); got 0.5"),
    ("buffer.sampling=random", "buffer.sampling must be one of"),
    ("run.progress=maybe", "run.progress must be true or false"),
    ("schedule.mode=async", "needs schedule.mu_accounting"),
    ("schedule.injected_gen_delay=-0.5", "schedule.injected_gen_delay must be in [0, 600]"),
    ("schedule.injected_gen_sigma=6", "schedule.injected_gen_sigma must be in [0, 5]"),
    ("schedule.injected_gen_delay=0.1", "schedule.injected_gen_delay (0.1 s) needs "
                                        "schedule.engine=ray"),
    ("schedule.injected_gen_sigma=0.5", "schedule.injected_gen_sigma (0.5) needs "
                                        "schedule.injected_gen_delay > 0"),
    ("trainer", "--set expects section.key=value"),
    ("lr=1", "--set key must be section.key"),
])
def test_bad_input_names_the_key(override, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        load_config("cpu_tiny", [override])


def _numeric_fields():
    """(section.key, its check) of every numeric config field."""
    return [(f"{name}.{f.name}", f.metadata["check"]) for name, cls in SECTIONS.items()
            for f in dataclasses.fields(cls)
            if type(getattr(cls(), f.name)) in (int, float)]


@pytest.mark.parametrize("key, check", _numeric_fields())
def test_a_wrong_type_and_a_value_out_of_range_report_the_same_range(key, check):
    """One line naming the key and the range stated beside the field, whatever is wrong."""
    messages = []
    for bad in ("abc", [1], -10**9, 10**9, -1e300, 1e300, float("nan")):
        try:
            check(key, bad)
        except ValueError as exc:
            messages.append(str(exc))
    assert len(messages) >= 3 and all(m.startswith(key + " ") for m in messages)
    ranges = {m.split(" got ")[0].rstrip(",; ") for m in messages}
    assert len(ranges) == 1, ranges
    assert not any(str(2**62) in m or "\n" in m for m in messages)


def test_import_stays_light_and_choices_come_from_their_owners():
    code = ("import sys, llm_experiments.config as c; assert 'torch' not in sys.modules; "
            "c.load_config('cpu_tiny')")
    subprocess.run([sys.executable, "-c", code], check=True)
    from llm_experiments.rl.choices import LOSSES, MODES
    from llm_experiments.samplers import BACKENDS
    from llm_experiments.tasks import TASKS
    from replaytheory.buffer import SAMPLING_MODES
    for key, names in (("trainer.loss", LOSSES), ("sampler.backend", BACKENDS),
                       ("schedule.mode", MODES), ("task.name", TASKS),
                       ("buffer.sampling", SAMPLING_MODES)):
        with pytest.raises(ValueError, match=f"{key} must be one of {sorted(names)}".replace(
                "[", r"\[").replace("]", r"\]")):
            load_config("cpu_tiny", [f"{key}=nonsense"])


@pytest.mark.parametrize("loss", ["grpo", "grpo_unclipped", "grpo_truncated"])
def test_top_p_below_one_is_refused_for_ratio_losses(loss):
    """The sampler's log-probs include the nucleus renormalisation, the trainer's do not: a
    ratio-based loss would see a fresh sample's ratio below 1."""
    with pytest.raises(ValueError, match=f"sampler.top_p \\(0.9\\) must be 1 with "
                                         f"trainer.loss={loss}.*trainer.loss=asymre"):
        load_config("cpu_tiny", ["sampler.top_p=0.9", f"trainer.loss={loss}"])
    assert load_config("cpu_tiny", ["sampler.top_p=0.9", "trainer.loss=asymre"]).sampler.top_p \
        == 0.9


def test_resume_needs_an_earlier_run(tmp_path, monkeypatch, capsys):
    """``run --out NEW --resume`` fails with one line instead of starting a fresh run."""
    from llm_experiments import cli
    from llm_experiments.engines import experiment

    def no_run(*args, **kwargs):
        raise AssertionError("a run was started")
    monkeypatch.setattr(experiment, "Experiment", no_run)
    out = tmp_path / "new"
    assert cli.main(["run", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m llm_experiments: error: --resume:") and "no run to resume" in err
    assert err.count("\n") == 1 and not out.exists()


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


def test_group_draws_need_whole_groups_per_trainer_and_shard():
    """Section 11.9: each trainer draws B / (T G) whole groups from a shard of whole groups."""
    base = ["buffer.sampling=groups_without_replacement", "schedule.group_size=8"]
    cfg = load_config("cpu_tiny", base + ["buffer.capacity=256"])
    assert cfg.buffer.sampling == "groups_without_replacement"
    with pytest.raises(ValueError, match=r"schedule.batch_size \(60\) must be a multiple of "
                                         r"schedule.group_size \(8\) = 8 .* e.g. 56 or 64"):
        load_config("cpu_tiny", base + ["schedule.batch_size=60"])
    with pytest.raises(ValueError, match=r"buffer.capacity \(100\) must be a multiple of "
                                         r"schedule.group_size \(8\) = 8"):
        load_config("cpu_tiny", base + ["buffer.capacity=100"])
    asynch = base + ["schedule.mode=async", "schedule.mu_accounting=2", "schedule.trainers=2",
                     "buffer.capacity=240", "schedule.batch_size=72"]
    with pytest.raises(ValueError, match=r"schedule.batch_size \(72\) must be a multiple of "
                                         r"schedule.group_size \(8\) x schedule.trainers "
                                         r"\(2\) = 16"):
        load_config("cpu_tiny", asynch)
    # without replacement a shard must keep a batch's groups; with replacement one group
    with pytest.raises(ValueError, match=r"buffer.capacity per shard \(56\) must be >= 64"):
        load_config("cpu_tiny", base + ["buffer.capacity=56"])
    load_config("cpu_tiny", ["buffer.sampling=groups_with_replacement", "buffer.capacity=8"])
    # the horizon rounds the capacity up to whole groups: 4 x 64 / 1.4 = 182.9 -> 184
    c = load_config("cpu_tiny", base + ["buffer.horizon=4", "schedule.replay_ratio=1.4"])
    assert c.buffer.capacity == 184
