"""One decoding step of ``direct.StaticDecoder`` in fewer operators: the same products.

At the shapes this project decodes on a CPU (hidden 64, a few to 64 rows) a step is bound by
the count of operators, not by FLOPs: each costs microseconds of dispatch whatever its size.
``fused_step`` cuts the count per layer from ~45 to ~25, each a change of bookkeeping, not of
arithmetic:

* one product for q, k and v and one for the MLP's gate and up projections, their weights
  stacked once per call (``FusedStep.of``: the sampler's weights change between calls,
  never during one);
* the rotary cos/sin looked up in a table of every position a call can reach
  (``rope_table``, made once per call by the model's own rotary module), and q and k rotated
  together;
* the norms through ``torch.nn.functional.rms_norm`` (float32 copies only; otherwise the
  model's own norm modules);
* attention as two batched products over the cache seen as (rows x kv heads, columns, head
  dim), the masked columns an additive -inf bias (``torch.baddbmm``).

Tokens and log-probs match ``direct.StaticDecoder``'s layer-by-layer step (bit for bit at
cpu_long's shape; tests/llm/test_llm_direct.py). Where a layer is not the plain Llama/Qwen2
layout (Qwen3's per-head q/k norms, an MLP without gate/up/down, a cache that is a view of a
larger one) ``fusable`` says no and the decoder takes its generic step.

``compiled_step`` is the same step through ``torch.compile`` (inductor's C++ code, with its
C++ wrapper, so a step is one call into compiled code, not ~100 Python-dispatched operators):
the sampler makes 1.4-1.5x (64 rows) and 2.3x (8 rows) the eager step's tokens/s at
cpu_long's shape, after a first call of 28 s that compiles (5 s once inductor's on-disk cache
holds the code; ``benchmarks/results/samplers_long.json``). Its tokens equal the eager step's, its
log-probs up to float32 rounding (inductor fuses and reorders the element-wise arithmetic).
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from .kernels import OneDNNLinear, onednn_linear


@dataclass(frozen=True)
class StepLayout:
    """Head counts of the model: query heads, key/value heads, head dim (all >= 1)."""

    heads: int
    kv_heads: int
    head_dim: int


def fusable(model) -> StepLayout | None:
    """The layout ``fused_step`` needs, or None where a layer is not of it (module
    docstring)."""
    layers = model.model.layers
    for layer in layers:
        a, m = layer.self_attn, layer.mlp
        if hasattr(a, "q_norm") or not all(hasattr(m, k) for k in
                                            ("gate_proj", "up_proj", "down_proj", "act_fn")):
            return None
    a = layers[0].self_attn
    return StepLayout(a.q_proj.out_features // a.head_dim,
                      a.k_proj.out_features // a.head_dim, a.head_dim)


def rope_table(model, positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (positions, head_dim): the model's rotary embedding at positions
    0 .. positions - 1 (>= 1), computed by its own module, so a lookup equals its output."""
    base = model.model
    dtype = base.embed_tokens.weight.dtype
    probe = torch.zeros((1, positions, 1), dtype=dtype, device=device)
    cos, sin = base.rotary_emb(probe, torch.arange(positions, device=device)[None])
    return cos[0], sin[0]


def _linear(module):
    """The product a projection runs (its own kernel: oneDNN or torch's default)."""
    return onednn_linear if type(module) is OneDNNLinear and \
        module.weight.dtype == torch.float32 else F.linear


def _norm(module, x):
    """An RMS norm module applied to x."""
    if x.dtype != torch.float32:  # the model's norm, which computes in float32 and casts
        return module(x)
    return F.rms_norm(x, (x.shape[-1],), module.weight, module.variance_epsilon)


def _stacked(*modules):
    """(weight, bias or None) of linear layers applied to the same input, stacked."""
    w = torch.cat([m.weight for m in modules])
    bias = [m.bias for m in modules]
    return w, (torch.cat(bias) if all(b is not None for b in bias) else None)


@dataclass(frozen=True)
class StackedLayer:
    """One layer's stacked products: q/k/v and gate/up (weight, bias or None)."""

    qkv: tuple
    gate_up: tuple


@dataclass
class FusedStep:
    """What ``fused_step`` needs besides the cache, made once per ``generate`` call (the
    sampler's weights change between calls, never during one): the layout, each layer's
    stacked weights, the rotary table (``rope_table``) and the mask bias (``mask_bias``,
    remade when the decoder drops rows)."""

    layout: StepLayout
    layers: list
    cos: torch.Tensor
    sin: torch.Tensor
    bias: torch.Tensor | None = None

    @classmethod
    def of(cls, model, layout: StepLayout, positions: int, device) -> "FusedStep":
        """Stack ``model``'s current weights; a rotary table of ``positions`` (>= 1)."""
        layers = [StackedLayer(_stacked(layer.self_attn.q_proj, layer.self_attn.k_proj,
                                        layer.self_attn.v_proj),
                               _stacked(layer.mlp.gate_proj, layer.mlp.up_proj))
                  for layer in model.model.layers]
        return cls(layout, layers, *rope_table(model, positions, device))


def mask_bias(valid: torch.Tensor, kv_heads: int, dtype) -> torch.Tensor:
    """Additive attention bias (rows x kv_heads, 1, columns): 0 where ``valid`` (rows,
    columns) allows a column, -inf elsewhere."""
    n, cols = valid.shape
    bias = torch.zeros((n, kv_heads, 1, cols), dtype=dtype, device=valid.device)
    return bias.masked_fill_(~valid[:, None, None], float("-inf")).view(n * kv_heads, 1, cols)


def _attention(layer, qk, v, keys, values, bias, layout: StepLayout, end: int):
    """The attention output (n, 1, heads x head_dim) of the rotated queries (n, heads, d) of
    ``qk``; the new key (rotated) and value are written at column ``end`` - 1 first."""
    n, h, kv, d = qk.shape[0], layout.heads, layout.kv_heads, layout.head_dim
    # narrow, not an index: ``compiled_step`` would specialise its code on an index's value
    keys.narrow(2, end - 1, 1).copy_(qk[:, h:, None])
    values.narrow(2, end - 1, 1).copy_(v[:, :, None])
    cols = keys.shape[2]
    q = qk[:, :h].reshape(n * kv, h // kv, d)
    k_all = keys.view(n * kv, cols, d)[:, :end]
    scores = torch.baddbmm(bias[..., :end], q, k_all.transpose(1, 2),
                           alpha=layer.self_attn.scaling)
    return torch.bmm(torch.softmax(scores, dim=-1),
                     values.view(n * kv, cols, d)[:, :end]).view(n, 1, h * d)


def _layer(layer, stacked: StackedLayer, x, cos, sin, keys, values, bias,
           layout: StepLayout, end: int):
    """One decoder layer on the hidden states x (n, 1, hidden) of the new tokens."""
    a, m = layer.self_attn, layer.mlp
    n, h, kv, d = x.shape[0], layout.heads, layout.kv_heads, layout.head_dim
    qkv = _linear(a.q_proj)(_norm(layer.input_layernorm, x), *stacked.qkv)
    qkv = qkv.view(n, h + 2 * kv, d)
    qk, half = qkv[:, :h + kv], d // 2
    qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
    o = _attention(layer, qk, qkv[:, h + kv:], keys, values, bias, layout, end)
    x = x + _linear(a.o_proj)(o, a.o_proj.weight, a.o_proj.bias)
    gate, up = _linear(m.gate_proj)(_norm(layer.post_attention_layernorm, x),
                                    *stacked.gate_up).split(m.up_proj.out_features, dim=-1)
    down = m.down_proj
    return x + _linear(down)(m.act_fn(gate) * up, down.weight, down.bias)


def fused_step(model, fused: FusedStep, tok, pos, keys, values, end: int):
    """Next-token logits (n, V) after the new tokens ``tok`` (n, 1) at positions ``pos``
    (n, 1; below the rotary table's length): per layer the cache's keys and values (n,
    kv_heads, columns, d; contiguous), ``end`` the columns attended to (the new token's
    column + 1). ``fused.bias`` must be set for these rows."""
    base = model.model
    cos, sin = fused.cos[pos], fused.sin[pos]  # (n, 1, d)
    x = base.embed_tokens(tok)
    for i, layer in enumerate(base.layers):
        x = _layer(layer, fused.layers[i], x, cos, sin, keys[i], values[i], fused.bias,
                   fused.layout, end)
    return model.lm_head(_norm(base.norm, x)[:, -1])


# The C++ compilers inductor tries (its ``cpp.cxx`` search), in its order.
CXX_COMPILERS = ("g++", "c++", "clang++")


def cxx_compiler() -> str | None:
    """Path of the first of ``CXX_COMPILERS`` on PATH, or None (``compiled_step`` needs one:
    inductor writes the step as C++ and builds it)."""
    return next((path for path in map(shutil.which, CXX_COMPILERS) if path), None)


@functools.cache
def _compiled_fused_step():
    """The compiled ``fused_step``, one per process (its code cache is dynamo's)."""
    return torch.compile(fused_step, options={"cpp_wrapper": True})


def compiled_step(model, fused: FusedStep, tok, pos, keys, values, end: int):
    """``fused_step`` through ``torch.compile`` (module docstring), compiled once per process.

    The rows are marked dynamic (they change between calls and at a compaction), so a call
    of another row count reuses the code. The columns attended to (``end``) become dynamic
    at the second step, the one recompile. Other sizes stay static until they change (a
    task whose prompts all have one length, such as cpu_long's, never changes them; marked
    dynamic from the start, the cache's columns measured 1.33x eager against 1.39-1.52x):
    a call of another prompt width or completion length compiles once more, after which
    they are dynamic too. A single row runs eagerly: dynamo specialises sizes 0 and 1, so it
    would compile again for the last row a compaction leaves. Compiling happens in the
    thread count of the moment (inductor builds it into the code)."""
    if tok.shape[0] == 1:
        return fused_step(model, fused, tok, pos, keys, values, end)
    for t in (tok, pos, fused.bias, *keys, *values):
        torch._dynamo.maybe_mark_dynamic(t, 0)
    return _compiled_fused_step()(model, fused, tok, pos, keys, values, end)
