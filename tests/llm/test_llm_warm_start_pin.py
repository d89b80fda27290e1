"""A saved warm start is loaded instead of trained, and a pinned digest is enforced."""

import pytest

from llm_helpers import small_config


def test_export_then_load_the_same_policy_and_refuse_another(tmp_path):
    from llm_experiments.policy.models import export_warm_start, load_policy, weights_sha256
    from llm_experiments.tasks.make import make_task

    cfg = small_config()
    model, _ = load_policy(cfg, make_task(cfg.task))
    saved = tmp_path / "warm_start"
    digest = export_warm_start(cfg, str(saved))
    assert digest == weights_sha256(model)
    with pytest.raises(ValueError, match="exists"):
        export_warm_start(cfg, str(saved))

    # A different warm-start recipe would train another policy; the saved one wins.
    pinned = small_config(f"model.warm_start_path={saved}", f"model.warm_start_sha256={digest}",
                          "model.warm_start_steps=3")
    loaded, tokenizer = load_policy(pinned, make_task(pinned.task))
    assert weights_sha256(loaded) == digest
    assert tokenizer.decode(tokenizer.encode("12+3=")) == "12+3="

    other = small_config("model.warm_start_steps=3", f"model.warm_start_sha256={digest}")
    with pytest.raises(ValueError, match="model.warm_start_sha256"):
        load_policy(other, make_task(other.task))
    wider = small_config(f"model.warm_start_path={saved}", "model.hidden_size=64",
                         "model.intermediate_size=128")
    with pytest.raises(ValueError, match="model.hidden_size=64 but saved 32"):
        load_policy(wider, make_task(wider.task))
    with pytest.raises(ValueError, match="model.warm_start_path"):
        load_policy(small_config(f"model.warm_start_path={tmp_path}"), make_task(cfg.task))


@pytest.mark.parametrize("bad", ["abc", "A" * 64, "g" * 64])
def test_a_pinned_digest_must_be_a_sha256(bad):
    with pytest.raises(ValueError, match="model.warm_start_sha256 must be"):
        small_config(f"model.warm_start_sha256={bad}")


def test_a_run_records_its_warm_start_digest(tmp_path):
    from llm_experiments.policy.models import export_warm_start
    from llm_helpers import run_small

    digest = export_warm_start(small_config(), str(tmp_path / "w"))
    summary, _ = run_small(tmp_path / "run", "run.steps=2", "eval.every=2")
    assert summary["warm_start_sha256"] == digest
