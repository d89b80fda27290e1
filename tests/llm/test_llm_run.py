"""End-to-end runs: probes (layout, no side effects), async emulation, kill and resume, CLI
errors, and the cpu_tiny learning check (slow)."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from llm_helpers import REPO, SMALL, run_small, small_config
from llm_experiments.cli import main
from llm_experiments.engines.experiment import run_experiment
from llm_experiments.engines.metrics import REQUIRED_KEYS, SUMMARY_KEYS, TIMING_KEYS, read_jsonl

DETERMINISTIC = ["schedule.mu_accounting=2.0"]


def strip_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


@pytest.fixture(scope="module")
def probed_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("runs") / "probed")
    cfg = small_config("run.steps=16", "probe.every=5", *DETERMINISTIC)
    return out, run_experiment(cfg, out)


def test_outputs_and_required_keys(probed_run):
    out, summary = probed_run
    assert sorted(os.listdir(out)) == ["checkpoint", "config.yaml", "metrics.jsonl",
                                       "probes.npz", "summary.json"]
    records = read_jsonl(os.path.join(out, "metrics.jsonl"))
    assert [r["step"] for r in records] == list(range(17))
    for r in records:
        assert set(REQUIRED_KEYS) <= set(r)
    assert set(SUMMARY_KEYS) <= set(summary)
    assert records[0]["eval_accuracy"] is not None and "pass@4" in records[0]
    assert summary["samples_generated"] == 16 * 8 and summary["samples_consumed"] == 16 * 16
    assert summary["mu_accounting"] == 2.0
    assert summary["compute_units"] == pytest.approx(16 + 2.0 * 128 / 16)
    h = summary["histograms"]
    assert sum(h["off_policiness"].values()) == 16 * 16
    assert summary["probe_seconds"] > 0


def test_probes_never_perturb_the_run(probed_run, tmp_path):
    out, _ = probed_run
    plain = str(tmp_path / "plain")
    run_experiment(small_config("run.steps=16", *DETERMINISTIC), plain)
    a = strip_timing(read_jsonl(os.path.join(out, "metrics.jsonl")))
    b = strip_timing(read_jsonl(os.path.join(plain, "metrics.jsonl")))
    assert a == b


def test_probe_layout_round_trip_and_fit(probed_run):
    from replaytheory.model.design import objective, optimal_design
    from replaytheory.model.noise import TabulatedNoise
    from replaytheory.fit.probes import OPTIONAL_TABLES, SCHEMA, ProbeSet
    out, _ = probed_run
    ps = ProbeSet.load(os.path.join(out, "probes.npz"))
    for name, cols in SCHEMA.items():
        # the reuse and contribution probes are off by default
        wanted = 0 if name in OPTIONAL_TABLES else 1
        assert set(cols) <= set(ps.tables[name]) and (ps.n_rows(name) > 0) == wanted, name
    with np.load(os.path.join(out, "probes.npz")) as z:
        assert not [k for k in z.files if k.split("/")[0] in OPTIONAL_TABLES]
    noise = ps.tables["noise"]
    assert set(np.unique(noise["probe_step"])) == {0, 5, 10, 15}
    assert np.all(noise["sq_noise"] > 0) and np.all(noise["ref_sq_error"] > 0)
    assert set(np.unique(noise["unit"])) == {0, 1}
    fresh = noise["source"] == 1
    assert np.all(noise["staleness"][fresh] == 0) and np.all(noise["drift"][fresh] == 0)
    stale = noise["staleness"] > 0
    assert np.all(noise["drift"][stale] > 0)
    bias = ps.tables["bias"]
    crn = bias["method"] == 1
    assert set(bias["staleness"][crn]) <= {1, 3} and crn.any()
    # common random numbers: paired differences vary less than unpaired ones
    assert np.median(bias["noise_sq"][crn] / bias["indep_noise_sq"][crn]) < 1
    mb = ps.tables["minibatch"]
    assert list(mb["probe_step"]) == [0, 5, 10, 15] and np.all(mb["sq_error"] > 0)
    np.testing.assert_allclose(mb["replay_ratio"], 2.0)
    assert ps.counts["unique_rollouts"] == 128 and ps.counts["samples_consumed"] == 256
    # the JSONL form carries the same numbers
    ps.save(os.path.join(out, "copy.jsonl"))
    back = ProbeSet.load(os.path.join(out, "copy.jsonl"))
    np.testing.assert_allclose(back.tables["noise"]["sq_noise"], noise["sq_noise"])
    # a simple calibration: sigma^2(s) per staleness, net of the reference error
    seq = noise["unit"] == 0
    s_vals = np.unique(noise["staleness"][seq])
    sig2 = [np.mean((noise["sq_noise"] - noise["ref_sq_error"])[seq & (noise["staleness"] == s)])
            for s in s_vals]
    model = TabulatedNoise(s_vals, np.maximum(sig2, 1e-12))
    design = optimal_design(mu=2.0, rho=0.1, noise=model)
    # the design is the minimum of J over the horizons the table covers (section 5)
    xs = np.linspace(min(1.0, design.horizon), model.max_horizon, 200)[:, None]
    ys = np.geomspace(0.05, 50, 200)[None, :]
    j = objective(xs, ys, mu=2.0, rho=0.1, noise=model)
    assert design.objective == pytest.approx(
        float(objective(design.horizon, design.replay_ratio, mu=2.0, rho=0.1, noise=model)))
    assert design.objective <= j.min() * (1 + 1e-9)
    assert design.objective == pytest.approx(j.min(), rel=0.02)
    assert design.regime == ("replay" if design.horizon >= 1 else "on-policy")


def test_async_emulation(tmp_path):
    summary, records = run_small(tmp_path / "a", "run.steps=12", "schedule.mode=async",
                                 "schedule.workers=2", "schedule.trainers=2",
                                 "schedule.mu_accounting=2.0", "schedule.refresh_every=2",
                                 "eval.every=100")
    # B W / (T mu) = 8 rollouts per step = 2 groups; latency round(mu T) = 4 steps
    assert summary["rollouts_per_step"] == 8 and summary["schedule"]["latency"] == 4
    assert summary["samples_generated"] == 12 * 8 and summary["samples_consumed"] == 12 * 16
    late = [r["staleness_mean"] for r in records if 6 <= r["step"] < 12]
    assert min(late) >= 4  # weights at least latency steps old
    assert set(summary["histograms"]["off_policiness"]) <= set(range(0, 12))


def test_async_emulation_with_group_draws(tmp_path):
    """``buffer.sampling=groups_with_replacement`` (theory.md section 11.9): each trainer
    draws B / (T G) = 2 whole groups from its shard, so the rollouts of a group share their
    use count and every count of the replay-ratio histogram is a multiple of G = 4."""
    summary, _ = run_small(tmp_path / "g", "run.steps=12", "schedule.mode=async",
                           "schedule.workers=2", "schedule.trainers=2",
                           "schedule.mu_accounting=2.0", "eval.every=100",
                           "buffer.sampling=groups_with_replacement")
    assert summary["samples_consumed"] == 12 * 16
    counts = summary["histograms"]["replay_ratio"]
    assert sum(counts.values()) == summary["samples_generated"]
    assert all(c % 4 == 0 for c in counts.values()) and len(counts) > 1


def _cli(out, *extra):
    return [sys.executable, "-m", "llm_experiments", "run", "--out", out, "--config",
            "cpu_tiny"] + [a for kv in SMALL + DETERMINISTIC + list(extra)
                           for a in ("--set", kv)]


def test_kill_and_resume_replays_exactly(tmp_path):
    env = {**os.environ, "PYTHONPATH": REPO}
    args = ("run.steps=30", "probe.every=7", "run.log_every=1")
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    subprocess.run(_cli(full, *args), check=True, env=env, capture_output=True)
    proc = subprocess.Popen(_cli(cut, *args), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = os.path.join(cut, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline:  # kill mid-run, between checkpoints
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 13:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not os.path.exists(os.path.join(cut, "summary.json"))
    done = subprocess.run([sys.executable, "-m", "llm_experiments", "run", "--out", cut,
                           "--resume"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    a = read_jsonl(os.path.join(full, "metrics.jsonl"))
    b = read_jsonl(os.path.join(cut, "metrics.jsonl"))
    assert [r["step"] for r in b] == list(range(31))  # no line lost or repeated
    assert strip_timing(a) == strip_timing(b)
    from replaytheory.fit.probes import ProbeSet
    pa = ProbeSet.load(os.path.join(full, "probes.npz"))
    pb = ProbeSet.load(os.path.join(cut, "probes.npz"))
    for name in pa.tables:
        for col in pa.tables[name]:
            np.testing.assert_allclose(pa.tables[name][col], pb.tables[name][col], rtol=1e-6)
    sa = json.load(open(os.path.join(full, "summary.json")))
    sb = json.load(open(os.path.join(cut, "summary.json")))
    assert sa["histograms"] == sb["histograms"]
    assert sa["best_eval_accuracy"] == sb["best_eval_accuracy"]


def test_cli_errors(tmp_path, capsys):
    out = str(tmp_path / "x")
    assert main(["run", "--out", out, "--set", "trainer.lrr=1"]) == 2
    assert "unknown config key trainer.lrr" in capsys.readouterr().err
    assert main(["run", "--out", out, "--set", "trainer.lr=-3"]) == 2
    assert "trainer.lr must be in (0, inf)" in capsys.readouterr().err
    os.makedirs(out)
    open(os.path.join(out, "f"), "w").close()
    assert main(["run", "--out", out]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["run", "--out", str(tmp_path / "m"), "--set", "model.name=/no/such/model",
                 "--set", f"run.cache_dir={tmp_path}"]) == 2
    assert "model.name='/no/such/model'" in capsys.readouterr().err
    assert main(["run", "--out", str(tmp_path / "d"), "--set", "task.name=math",
                 "--set", "task.dataset=/no/such.jsonl"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_run_that_fails_before_its_first_checkpoint_leaves_no_folder(tmp_path, monkeypatch,
                                                                     capsys):
    """Issue 38: a bf16 run that failed at its first update left a half-made --out that
    blocked a plain rerun (with the workaround set, say). A run that fails before its first
    checkpoint now leaves the folder as it found it; an empty folder given stays."""
    from llm_experiments.engines import experiment
    out = tmp_path / "run"

    def fail(self, *args, **kwargs):
        raise RuntimeError("a failure at the first update")
    monkeypatch.setattr(experiment.Experiment, "train_step", fail)
    with pytest.raises(RuntimeError, match="first update"):
        run_small(out)
    assert not out.exists()
    out.mkdir()
    with pytest.raises(RuntimeError, match="first update"):
        run_small(out)
    assert out.is_dir() and not list(out.iterdir())
    monkeypatch.undo()
    summary, _ = run_small(out, "run.steps=2")  # the plain rerun
    assert summary["steps"] == 2


def test_the_first_warm_start_shows_its_progress(tmp_path, capsys):
    """Issue 38: ``run`` printed nothing for the ~55 s of a first warm start; with
    run.progress its steps show on stderr (and nothing without)."""
    from llm_experiments.policy.models import char_tokenizer, tiny_model
    from llm_experiments.policy.warm_start import warm_start
    from llm_experiments.tasks.make import make_task
    for progress in (True, False):
        cfg = small_config("model.warm_start_steps=4", f"run.progress={progress}")
        task = make_task(cfg.task)
        tok = char_tokenizer(task.alphabet())
        warm_start(tiny_model(cfg, len(tok)), tok, task, cfg)
        err = capsys.readouterr().err
        assert ("warm start (once per config, then cached)" in err and "4/4" in err) \
            == progress


@pytest.mark.slow
def test_cpu_tiny_rl_beats_warm_start(tmp_path):
    """The shipped cpu_tiny config (shortened to 150 steps, no probes) learns."""
    from llm_helpers import CACHE
    from llm_experiments.config import load_config
    cfg = load_config("cpu_tiny", ["run.steps=150", "probe.every=0", "run.progress=false",
                                   f"run.cache_dir={CACHE}"])
    s = run_experiment(cfg, str(tmp_path / "tiny"))
    assert s["warm_start_accuracy"] < 0.6
    assert s["best_eval_accuracy"] >= s["warm_start_accuracy"] + 0.15


def _trainer(tmp_path, *overrides):
    """An ``Experiment`` of the small config (same warm-start weights for every override)."""
    from llm_experiments.engines.experiment import Experiment
    return Experiment(small_config("eval.every=100", *overrides), str(tmp_path))


def test_the_probes_read_the_experiment_itself(tmp_path):
    """The emulated engine is the probes' ``RunView``; they read it on every call, so a buffer
    replaced on resume is the one they see."""
    from llm_experiments.probing.probes import RunView
    from llm_experiments.rl.buffer import RolloutBuffer
    exp = _trainer(tmp_path, "probe.every=5")
    assert isinstance(exp, RunView) and exp.prober.run is exp
    exp.advance()
    counts = exp.run_counts()
    assert counts.steps == 1 and counts.unique_rollouts == exp.clock.generated > 0
    assert len(exp.buffer_versions()) == counts.unique_rollouts
    assert 0 in exp.snapshot_versions() and exp.snapshot(0).version == 0
    exp.buffer = RolloutBuffer.for_config(exp.cfg)
    assert len(exp.buffer_versions()) == 0


def _update(exp, rollouts):
    """(gradient, loss) of one trainer step on ``rollouts``; the weights are put back."""
    before = {k: v.clone() for k, v in exp.model.state_dict().items()}
    stats = exp.train_step(rollouts, keep_grad=True)
    exp.model.load_state_dict(before)
    return stats["grad"], stats["loss"]


def _rollout_grads(exp, rollouts, loss="grpo"):
    """Each rollout's loss gradient on its own (one backward pass per rollout), flattened."""
    import torch

    from llm_experiments.rl.losses import batch_logprobs, collate, policy_loss
    out = []
    for r in rollouts:
        exp.model.zero_grad(set_to_none=True)
        batch = collate([r], exp.tokenizer.pad_token_id)
        logp, _ = batch_logprobs(exp.model, batch, exp.cfg.sampler.temperature)
        policy_loss(logp, batch, **{**exp.loss_kwargs, "loss": loss}).sum().backward()
        out.append(torch.cat([p.grad.reshape(-1) for p in exp.model.parameters()
                              if p.requires_grad]))
    exp.model.zero_grad(set_to_none=True)
    return torch.stack(out)


@pytest.fixture(scope="module")
def fresh_batch(tmp_path_factory):
    """16 rollouts (4 groups) generated by the warm-start weights, some with signal."""
    exp = _trainer(tmp_path_factory.mktemp("gen"))
    rollouts = exp.produce(4, version=0)
    assert any(r.advantage != 0 for r in rollouts)
    return rollouts


def test_per_sample_clip_clips_each_rollout_gradient(fresh_batch, tmp_path):
    """trainer.per_sample_clip = c: the update is the mean of the rollouts' gradients, each
    first scaled to norm at most c; off, the plain mean."""
    plain = _trainer(tmp_path / "plain")
    per = _rollout_grads(plain, fresh_batch)
    norms = per.norm(dim=1)
    c = float(norms[norms > 0].median())  # about half the rollouts get clipped
    off, _ = _update(plain, fresh_batch)
    np.testing.assert_allclose(off, per.mean(0), rtol=1e-4, atol=1e-6)
    on, _ = _update(_trainer(tmp_path / "clip", f"trainer.per_sample_clip={c!r}"), fresh_batch)
    scale = np.minimum(1.0, c / np.maximum(norms.numpy(), 1e-12))
    np.testing.assert_allclose(on, (per.numpy() * scale[:, None]).mean(0), rtol=1e-4,
                               atol=1e-6)
    assert (norms > 1.5 * c).any()
    assert float(on.norm()) <= c * (1 + 1e-5)  # a mean of vectors no longer than c
    assert float((on - off).norm()) > 0.1 * float(off.norm())


def test_micro_batches_do_not_change_the_update(fresh_batch, tmp_path):
    whole = _update(_trainer(tmp_path / "whole"), fresh_batch)
    parts = _update(_trainer(tmp_path / "parts", "trainer.micro_batch=5"), fresh_batch)
    np.testing.assert_allclose(parts[0], whole[0], rtol=1e-4, atol=1e-6)
    assert parts[1] == pytest.approx(whole[1], rel=1e-5, abs=1e-7)


def test_train_layouts_give_the_same_update(fresh_batch, tmp_path):
    """run.train_layout: "auto" keeps a grouped (on-policy) batch on the shared-prompt layout,
    bitwise; on a batch of distinct prompts it takes the sequence layout, whose update equals
    the shared layout's to float32 rounding."""
    default = _trainer(tmp_path / "default")
    auto = _trainer(tmp_path / "auto", "run.train_layout=auto")
    grouped = _update(default, fresh_batch)
    assert all(np.array_equal(a, b) for a, b in zip(grouped, _update(auto, fresh_batch)))
    distinct = fresh_batch[::4]  # one rollout of each group
    shared, seq = _update(default, distinct), _update(auto, distinct)
    np.testing.assert_allclose(seq[0], shared[0], rtol=1e-4, atol=1e-6)
    assert seq[1] == pytest.approx(shared[1], rel=1e-5, abs=1e-7)


def test_losses_differ_where_they_should(fresh_batch, tmp_path):
    """On rollouts of the current weights (ratio 1) the GRPO variants share one gradient and
    AsymRE (summed, not averaged, over tokens) has another; once the behaviour log-probs are
    off by 0.5 per token, GRPO's clip removes the gradient of the rollouts it clips."""
    import dataclasses
    exps = {loss: _trainer(tmp_path / loss, f"trainer.loss={loss}")
            for loss in ("grpo", "grpo_unclipped", "grpo_truncated", "asymre")}
    fresh = {loss: _update(e, fresh_batch)[0] for loss, e in exps.items()}
    np.testing.assert_allclose(fresh["grpo_unclipped"], fresh["grpo"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(fresh["grpo_truncated"], fresh["grpo"], rtol=1e-4, atol=1e-6)
    assert float((fresh["asymre"] - fresh["grpo"]).norm()) > 0.1 * float(fresh["grpo"].norm())
    # each rollout's AsymRE gradient: -A grad(sum of log-probs) / max_new_tokens
    per = _rollout_grads(exps["asymre"], fresh_batch, "asymre")
    np.testing.assert_allclose(fresh["asymre"], per.mean(0), rtol=1e-4, atol=1e-6)
    # ratio e^0.5 > 1 + eps_high: GRPO clips the rollouts with A > 0 (no gradient), the
    # unclipped loss weighs every rollout by e^0.5
    stale = [dataclasses.replace(r, logprobs=r.logprobs - 0.5) for r in fresh_batch]
    grpo, _ = _update(exps["grpo"], stale)
    unclipped, _ = _update(exps["grpo_unclipped"], stale)
    per = _rollout_grads(exps["grpo"], fresh_batch)
    adv = np.array([r.advantage for r in fresh_batch])
    assert (adv > 0).any() and (adv < 0).any()
    np.testing.assert_allclose(unclipped, np.exp(0.5) * per.mean(0), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(grpo, np.exp(0.5) * (per.numpy() * (adv < 0)[:, None]).mean(0),
                               rtol=1e-3, atol=1e-6)


def test_pretrained_model_from_a_local_folder(tmp_path):
    """model.name = a folder: the pretrained path (AutoModel / AutoTokenizer) end to end."""
    from llm_helpers import tiny_policy
    model, tok = tiny_policy(32, 2, 64)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    s, _ = run_small(tmp_path / "run", "run.steps=3", f"model.name={tmp_path / 'm'}",
                     "eval.every=100")
    assert s["samples_consumed"] == 3 * 16 and s["parameters"] == sum(
        p.numel() for p in model.parameters())
