"""Policies: a tiny Qwen2-style model with a local char tokenizer, or a pretrained model.

The tiny model is built from ``ModelConfig`` (untied input and output embeddings, so that a
vLLM weight reload refreshes the output layer too) and warm-started by supervised training on
the task's reference answers (``warm_start.py``), so that RL starts from a policy that
sometimes succeeds. The warm start is cached under the cache directory, keyed by a hash of the
model and task sections.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import torch

from .config import Config
from .warm_start import warm_start

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def encode_prompt(tokenizer, text: str, chat: bool) -> list[int]:
    """Token ids of a prompt, through the chat template for instruct models."""
    if chat:
        # Render to text first: with tokenize=True the return type differs across versions.
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                             add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def load_policy(cfg: Config, task):
    """(model, tokenizer) on ``run.device``: the cached warm-started tiny model or a
    pretrained one. Raises ValueError with a clear message if a model cannot be found."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # keep the terminal for the run's own progress bar
    m = cfg.model
    device = torch.device(cfg.run.device)
    if m.name == "tiny":
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
        # AutoTokenizer drops the spaces of a saved char tokenizer; reload it directly.
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path, padding_side="right")
        from transformers import Qwen2ForCausalLM
        model = Qwen2ForCausalLM.from_pretrained(path, attn_implementation=m.attn_implementation,
                                                 dtype=DTYPES[m.dtype])
        return model.to(device), tokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(m.name)
        model = AutoModelForCausalLM.from_pretrained(
            m.name, dtype=DTYPES[m.dtype], attn_implementation=m.attn_implementation)
    except (OSError, ValueError) as exc:
        raise ValueError(f"model.name={m.name!r}: cannot load it (not 'tiny', not a local "
                         f"folder, and not downloadable here): {exc}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer


def param_count(model) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def flops_per_token(model, train: bool) -> float:
    """FLOPs estimate per token: 2 P forward (generation), 6 P forward+backward (training)."""
    return (6.0 if train else 2.0) * param_count(model)
