"""Memory of a trainer update: a prediction of its peak, the logit chunk and the micro-batch
that keep it within a budget (issue 28, item 2).

The peak of an update (bytes) is the persistent state, float32 weights W, their gradients
G and Adam's two moments, plus the larger of (a) the activations one micro-batch saves for
its backward pass and the transient of one logit chunk, and (b) the optimizer step's own
temporaries (about one more copy of the weights, ``torch.optim`` foreach/fused).

Saved activations are counted per token and decoder layer from the ops of a Qwen2/Qwen3
layer (``direct.run_layers``): the residual input and the normed input of each of the two
RMSNorms (kept in float32, as transformers' norms compute in float32), the q/k/v
projections and their rotated copies, the attention output and its reshaped copy, and the
MLP's gate, up, activation and product (4 x intermediate). Under autocast the projections
are saved in the compute dtype and the residual stream stays float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GIB = 2 ** 30
# A logit chunk's float32 (tokens, V) tensors held at once: logits, log-softmax, its
# gradient (the backward of one chunk).
LOGIT_COPIES = 3
# Bytes one logit chunk may take (LOGIT_COPIES tensors together): small next to the weights
# of any model that needs chunking, large enough that the head's product stays efficient.
LOGIT_CHUNK_BYTES = 1 * GIB
# The memory budget of an update where trainer.memory_gb is 0: on a CUDA device what is free
# for it less the rest of this share of the device's memory (``budget_bytes``), or a fixed
# amount on CPU (the same micro-batch on every machine).
CUDA_SHARE, CPU_BUDGET_BYTES = 0.85, 16 * GIB


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a decoder-only transformer depends on: params (trainable
    parameter count), hidden, layers, q_dim / kv_dim (query and key widths, heads x
    head_dim), intermediate (MLP width), vocab."""

    params: int
    hidden: int
    layers: int
    q_dim: int
    kv_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, model) -> "ModelShape":
        """The shape of a transformers Qwen2/Qwen3/Llama-style causal LM."""
        c = model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(params=sum(p.numel() for p in model.parameters() if p.requires_grad),
                   hidden=c.hidden_size, layers=c.num_hidden_layers,
                   q_dim=c.num_attention_heads * head_dim,
                   kv_dim=c.num_key_value_heads * head_dim,
                   intermediate=c.intermediate_size, vocab=c.vocab_size)


@dataclass(frozen=True)
class UpdateMemory:
    """Predicted bytes of one update: state (weights, gradients, Adam moments, all float32),
    activations (saved by one micro-batch), logits (one chunk's transient), step (the
    optimizer's temporaries), peak (state + the larger of activations + logits and step)."""

    state: int
    activations: int
    logits: int
    step: int
    peak: int


def activation_bytes_per_token(shape: ModelShape, compute_bytes: int) -> int:
    """Bytes saved for backward per token by the decoder layers and the final norm:
    compute_bytes 4 (float32) or 2 (bfloat16/float16 autocast, residual stream float32)."""
    residual = 4 * 2 * shape.hidden * 2      # two norms: input and normed output, float32
    cast = 2 * shape.hidden * compute_bytes if compute_bytes != 4 else 0  # normed -> dtype
    attention = (4 * shape.q_dim + 4 * shape.kv_dim) * compute_bytes
    mlp = 4 * shape.intermediate * compute_bytes
    return shape.layers * (residual + cast + attention + mlp) + 2 * 4 * shape.hidden


def logit_chunk(vocab: int, budget: int = LOGIT_CHUNK_BYTES) -> int:
    """Tokens per logit chunk (>= 1) such that its LOGIT_COPIES float32 (tokens, vocab)
    tensors fit ``budget`` bytes."""
    return max(1, budget // (LOGIT_COPIES * 4 * vocab))


def predict_update_memory(shape: ModelShape, micro_batch: int, seq_len: int, *,
                          compute_bytes: int = 4, chunk: int = 0) -> UpdateMemory:
    """Predicted bytes of an update whose micro-batches hold ``micro_batch`` (>= 1) rows of
    ``seq_len`` (>= 1) tokens (prompt + completion); ``chunk``: logit chunk in tokens (0 =
    all of a micro-batch's completion tokens at once, bounded by ``seq_len`` per row)."""
    tokens = micro_batch * seq_len
    state = 4 * 4 * shape.params
    acts = tokens * activation_bytes_per_token(shape, compute_bytes)
    logit_tokens = min(chunk, tokens) if chunk else tokens
    logits = LOGIT_COPIES * 4 * shape.vocab * logit_tokens
    step = 4 * shape.params
    return UpdateMemory(state=state, activations=acts, logits=logits, step=step,
                        peak=state + max(acts + logits, step))


def budget_bytes(memory_gb: float, device, own: int = 0) -> int:
    """The update's memory budget, bytes: ``memory_gb`` GiB if > 0; else, on a CUDA device,
    what is free for it: the bytes the driver reports free (``torch.cuda.mem_get_info``,
    so every process's tensors are already out: samplers in Ray actors on the same GPU, an
    evaluator, this process's sampler copy and decode cache), plus what this process's
    allocator has reserved but not allocated, plus ``own`` (>= 0: bytes of the trainer's
    state already allocated, ``trainer_bytes``, which ``predict_update_memory`` counts in
    its peak), less (1 - CUDA_SHARE) of the device's memory as headroom (fragmentation,
    the CUDA context); CPU_BUDGET_BYTES on CPU."""
    if memory_gb > 0:
        return int(memory_gb * GIB)
    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + cached + own - (1 - CUDA_SHARE) * total)
    return CPU_BUDGET_BYTES


def trainer_bytes(model, optimizer, device) -> int:
    """Bytes on a CUDA ``device`` of ``model``'s parameters and gradients and
    ``optimizer``'s state (what ``predict_update_memory`` counts as the update's state);
    0 elsewhere (the CPU budget is fixed)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    own = [p for p in model.parameters()] + [p.grad for p in model.parameters()
                                             if p.grad is not None]
    own += [t for state in optimizer.state.values() for t in state.values()
            if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in own if t.device == device)


def choose_micro_batch(shape: ModelShape, rows: int, seq_len: int, budget: int, *,
                       compute_bytes: int = 4, chunk: int = 0) -> int:
    """The largest micro-batch in [1, rows] whose predicted peak fits ``budget`` bytes (1
    if none does: the smallest the trainer can run)."""
    def fits(m):
        return predict_update_memory(shape, m, seq_len, compute_bytes=compute_bytes,
                                     chunk=chunk).peak <= budget
    if fits(rows):
        return rows
    lo, hi = 1, rows  # fits(lo) assumed; the answer lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
