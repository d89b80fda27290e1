"""Policies: a tiny Qwen2-style model with a local char tokenizer, or a pretrained model.

The tiny model is built from ``ModelConfig`` (untied input and output embeddings, so that a
vLLM weight reload refreshes the output layer too) and warm-started by supervised training on
the task's reference answers (``warm_start.py``), so that RL starts from a policy that
sometimes succeeds. The warm start is cached under the cache directory, keyed by a hash of the
model and task sections.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile

import torch

from ..config import Config
from .choices import DTYPE_NAMES
from .warm_start import warm_start

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def cache_dir(cfg: Config) -> str:
    """The cache directory: ``run.cache_dir``, else ``$LLM_EXPERIMENTS_CACHE``, else
    ``$XDG_CACHE_HOME/llm_experiments``, else ``~/.cache/llm_experiments``.

    Per user rather than per working directory, so that every run shares one warm start
    whatever folder it is started from (the cached files themselves do not depend on it).
    """
    return cfg.run.cache_dir or os.environ.get("LLM_EXPERIMENTS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "llm_experiments")


def char_tokenizer(alphabet: str):
    """A character-level ``PreTrainedTokenizerFast``: ids 0-2 are pad, eos, unk."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for ch in sorted(set(alphabet)):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS,
                                   unk_token=UNK, padding_side="right")


def tiny_model(cfg: Config, vocab_size: int):
    """A randomly initialised Qwen2-style causal LM of the configured shape (torch seeded)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    m = cfg.model
    qcfg = Qwen2Config(vocab_size=vocab_size, hidden_size=m.hidden_size,
                       num_hidden_layers=m.layers, num_attention_heads=m.heads,
                       num_key_value_heads=m.kv_heads, intermediate_size=m.intermediate_size,
                       max_position_embeddings=m.max_len, tie_word_embeddings=False,
                       bos_token_id=None, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(m.warm_start_seed)
    return Qwen2ForCausalLM._from_config(qcfg, attn_implementation=m.attn_implementation,
                                         dtype=DTYPES[m.dtype])


def trainer_dtype(cfg: Config) -> torch.dtype:
    """Dtype of the trainer's parameters: float32 when ``trainer.master_weights`` (float32
    master weights of a bfloat16/float16 ``model.dtype``: Adam's updates at small learning
    rates are far below a bfloat16 weight's resolution, ~0.4% of its value, and would round
    away), else ``model.dtype``."""
    return torch.float32 if cfg.trainer.master_weights else DTYPES[cfg.model.dtype]


def autocast(cfg: Config, device: torch.device):
    """Context of the trainer's forward pass: autocast to ``model.dtype`` where the
    parameters are float32 masters of a lower-precision ``model.dtype`` (matrix products in
    that dtype, reductions and the loss in float32); else nothing (bitwise the plain
    forward). float16 has no loss scaling here: prefer bfloat16."""
    low = DTYPES[cfg.model.dtype]
    if trainer_dtype(cfg) == low:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=low)


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids of a prompt, through the chat template for instruct models."""
    if chat:
        # Render to text first: with tokenize=True the return type differs across versions.
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def cached_warm_start(cfg: Config, task) -> str:
    """The folder of the tiny model's warm start for this config on this machine, trained
    (``warm_start.py``) and cached on first use, keyed by the model and task sections.

    The supervised phase is chaotic in floating point: the same code, config and seed give a
    different policy on another CPU (cpu_tiny: eval accuracy 0.312 on the machines of the
    earlier sweeps, 0.26 on an AMD EPYC). A setting meant to be continued on other machines
    pins its policy with ``model.warm_start_path`` (``export_warm_start``).
    """
    key = cfg.section_hash("model", "task")
    path = os.path.join(cache_dir(cfg), "warm_start", key)
    if not os.path.isdir(path):
        tokenizer = char_tokenizer(task.alphabet())
        model = tiny_model(cfg, len(tokenizer))
        warm_start(model, tokenizer, task, cfg)
        # Write beside the final folder and rename: a crash never leaves a partial cache.
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(path), prefix=".tmp-")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, path)
        except OSError:  # another process cached the same key first
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def weights_sha256(model) -> str:
    """sha256 (hex) of a model's state: every tensor's name, dtype, shape and bytes, in name
    order. Equal digests mean the same policy bit for bit."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# Shape fields of ``model`` that a saved warm start must match (Qwen2 config names).
_SHAPE = {"hidden_size": "hidden_size", "layers": "num_hidden_layers", "heads":
          "num_attention_heads", "kv_heads": "num_key_value_heads",
          "intermediate_size": "intermediate_size"}


def _load_tiny(cfg: Config, task):
    """(model, tokenizer) of the tiny model's warm start, checked against the config's shape
    and pinned digest; ValueError names the field that does not match."""
    m = cfg.model
    path = m.warm_start_path or cached_warm_start(cfg, task)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model.warm_start_path={path!r} holds no saved model (config.json); "
                         "write one with `python -m llm_experiments.policy.models --out DIR`")
    # AutoTokenizer drops the spaces of a saved char tokenizer; reload it directly.
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path, padding_side="right")
    model = Qwen2ForCausalLM.from_pretrained(path, attn_implementation=m.attn_implementation,
                                             dtype=DTYPES[m.dtype])
    wrong = {f"model.{k}": (getattr(m, k), getattr(model.config, q)) for k, q in _SHAPE.items()
             if getattr(m, k) != getattr(model.config, q)}
    if wrong:
        raise ValueError(f"model.warm_start_path={path!r} holds another shape: "
                         + ", ".join(f"{k}={v[0]} but saved {v[1]}" for k, v in wrong.items()))
    if m.warm_start_sha256 and weights_sha256(model) != m.warm_start_sha256:
        raise ValueError(f"model.warm_start_sha256={m.warm_start_sha256!r}, but the warm start "
                         f"in {path!r} has {weights_sha256(model)!r} (a warm start trained on "
                         "another machine differs: set model.warm_start_path to the saved one)")
    return model, tokenizer


def load_policy(cfg: Config, task):
    """(model, tokenizer) on ``run.device`` with parameters in ``trainer_dtype``: the tiny
    model's warm start (``_load_tiny``: saved at ``model.warm_start_path``, else cached) or a
    pretrained one, loaded in ``model.dtype``. Raises ValueError with a clear message if a
    model cannot be found or is not the pinned one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # keep the terminal for the run's own progress bar
    m = cfg.model
    device = torch.device(cfg.run.device)
    if m.name == "tiny":
        model, tokenizer = _load_tiny(cfg, task)
        return model.to(device=device, dtype=trainer_dtype(cfg)), tokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(m.name)
        model = AutoModelForCausalLM.from_pretrained(
            m.name, dtype=DTYPES[m.dtype], attn_implementation=m.attn_implementation)
    except (OSError, ValueError) as exc:
        raise ValueError(f"model.name={m.name!r}: cannot load it (not 'tiny', not a local "
                         f"folder, and not downloadable here): {exc}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device=device, dtype=trainer_dtype(cfg)), tokenizer


def param_count(model) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def flops_per_token(model, train: bool) -> float:
    """FLOPs estimate per token: 2 P forward (generation), 6 P forward+backward (training)."""
    return (6.0 if train else 2.0) * param_count(model)


def export_warm_start(cfg: Config, out_dir: str) -> str:
    """Save the tiny model's warm start for ``cfg`` (``model.warm_start_path`` if set, else
    this machine's cached one) to the new folder ``out_dir``; returns its ``weights_sha256``.
    Commit the folder and set ``model.warm_start_path`` to it so that every machine starts
    from this policy."""
    from ..tasks.make import make_task
    if cfg.model.name != "tiny":
        raise ValueError(f"model.name={cfg.model.name!r}: only the tiny model has a warm start")
    if os.path.exists(out_dir):
        raise ValueError(f"out={out_dir!r} exists; export writes a new folder")
    model, tokenizer = _load_tiny(cfg, make_task(cfg.task))
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".tmp-")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.rename(tmp, out_dir)
    return weights_sha256(model)


def main(argv=None) -> int:
    """``python -m llm_experiments.policy.models --config NAME [--set k=v ...] --out DIR``: save the
    warm start and print its digest (for ``model.warm_start_sha256``)."""
    import argparse
    import sys

    from ..config import load_config
    p = argparse.ArgumentParser(prog="python -m llm_experiments.policy.models",
                                description="save the tiny model's warm start to a folder")
    p.add_argument("--config", default="cpu_tiny", help="config name or YAML (default cpu_tiny)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="SECTION.KEY=VALUE", help="override a config value (repeatable)")
    p.add_argument("--out", required=True, help="folder to create")
    a = p.parse_args(argv)
    try:
        digest = export_warm_start(load_config(a.config, a.overrides), a.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"model.warm_start_path={a.out}\nmodel.warm_start_sha256={digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
