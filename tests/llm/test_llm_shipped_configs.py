"""Every shipped config (``llm_experiments/configs/*.yaml``) runs two steps on CPU with its own
defaults: dtype, kernels, engine, probes (issue 38: every bfloat16 config failed at its first
update and no test ran one).

A config whose policy or data live on the hub (qwen3_0p6b_math: Qwen/Qwen3-0.6B, OpenR1-Math,
MATH-500) cannot load them offline, so its run takes local stand-ins of the same kind: a
randomly initialised Qwen3 of the smallest shape, a char tokenizer with a chat template, and
a few math records in a local JSONL file; ``run.device=cpu``, and its 1,024-token
completions cut to 8. Everything else is the config's own."""

import json
import os

import numpy as np
import pytest

from llm_helpers import REPO
from llm_experiments.config import load_config

CONFIGS = sorted(f[:-5] for f in os.listdir(os.path.join(REPO, "llm_experiments", "configs"))
                 if f.endswith(".yaml"))
# The committed warm start of each tiny config's shape (for cpu_tiny the pin experiments/*.yaml
# use): a warm start trained here takes minutes and differs from CPU to CPU.
COMMITTED_WARM_STARTS = {
    "cpu_tiny": os.path.join(REPO, "results", "heldout_init", "warm_start"),
    "cpu_long": os.path.join(REPO, "results", "cpu_long", "warm_start")}


def hub_stand_ins(tmp_path) -> list[str]:
    """Overrides that replace a hub model and hub data by local ones of the same kind."""
    import torch
    import transformers

    from llm_experiments.policy.models import char_tokenizer
    rows = [{"problem": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(1, 13)]
    for part, some in (("train", rows[:8]), ("eval", rows[8:])):
        (tmp_path / f"{part}.jsonl").write_text("\n".join(json.dumps(r) for r in some))
    tok = char_tokenizer("".join(sorted({c for r in rows for c in r["problem"] + r["answer"]}))
                         + "\\{}.PlasereonbxdyutiwfS\n")
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}={% endif %}")
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=2048, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=None))
    folder = str(tmp_path / "qwen3")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return [f"model.name={folder}", f"task.dataset={tmp_path / 'train.jsonl'}",
            f"task.eval_dataset={tmp_path / 'eval.jsonl'}",
            "run.device=cpu", "sampler.max_new_tokens=8"]


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_runs_two_steps_on_cpu_with_its_defaults(name, tmp_path):
    from llm_experiments.engines.experiment import run_experiment
    from llm_experiments.engines.metrics import read_jsonl
    cfg = load_config(name)
    local = [f"model.warm_start_path={COMMITTED_WARM_STARTS[name]}"] \
        if cfg.model.name == "tiny" else hub_stand_ins(tmp_path)
    out = str(tmp_path / "run")
    run_experiment(load_config(name, local + ["run.steps=2", "run.progress=false"]), out)
    losses = [r["loss"] for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if "loss" in r]
    assert len(losses) == 2 and np.isfinite(losses).all()
