"""Drive a Llama/Qwen-style transformers model layer by layer: static-cache decoding and a
training forward that computes each distinct prompt once.

The model's generic ``forward`` rebuilds attention masks and cache objects and records
outputs on every call, and it cannot share work between rows. Here the model's own modules
(embedding, norms, q/k/v/o projections, rotary embedding, MLP, head) are called directly and
only attention is ours: one ``scaled_dot_product_attention`` per layer with a boolean mask.
Same modules, same rotary formula, same attention math; results agree with the generic
forward to float32 rounding (tests/llm/test_llm_direct.py).

* ``StaticDecoder`` (sampling): the key/value cache is preallocated for prompt width + new
  tokens and written in place; the prompt prefill runs once per distinct prompt (a group of G
  rollouts shares one) and its keys/values are copied to the rows that share it.
* ``shared_prompt_logits`` (training): the prompt segment runs once per distinct prompt of
  the batch, the completion segment attends to its row's prompt keys/values and to itself.
  Gradients flow through both segments (the prompt's share is summed over its rows), so
  the loss and its gradient are those of the full per-row forward.
* ``sequence_logits`` (training, a batch of mostly distinct prompts): each row's prompt and
  completion in one pass, the last layer only from the column that predicts the first
  completion token. Sharing saves nothing when every row has its own prompt, and one pass
  costs less than two (``run.train_layout``, ``benchmarks/update_cost.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.functional import scaled_dot_product_attention

from .decode_step import FusedStep, compiled_step, fusable, fused_step, mask_bias


def supports(model) -> bool:
    """Whether ``model`` has the layout driven here (decoder layers with q/k/v/o projections,
    pre-norms and an MLP; full attention only)."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if layers is None or not all(hasattr(model, a) for a in ("lm_head",)) or \
            not all(hasattr(base, a) for a in ("embed_tokens", "rotary_emb", "norm")):
        return False
    if any(t != "full_attention" for t in getattr(model.config, "layer_types", None) or []):
        return False
    need = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
    return all(hasattr(layer.self_attn, a) for layer in layers for a in need) and \
        all(hasattr(layer, a) for layer in layers
            for a in ("input_layernorm", "post_attention_layernorm", "mlp"))


def _rotate(x, cos, sin):
    """Rotary position embedding of x (n, heads, s, d) with cos, sin (n, s, d)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


def run_layers(model, x, pos, attend, keep_from: int = 0):
    """Final-normed hidden states (n, s - keep_from, h) of tokens with embeddings x (n, s, h)
    at positions pos (n, s), from position ``keep_from`` (0 <= keep_from < s) on.
    ``attend(layer, q, k, v)`` returns the attention output (n, heads, s', d) of the rotated
    queries (s' of them) and the keys and values (all s) of these tokens.

    With keep_from > 0 the last layer computes only keys and values at the positions before
    ``keep_from`` (all a later token needs of them) and queries, attention, output projection
    and MLP from ``keep_from`` on: the states returned are the same, the work of the last
    layer's earlier positions is skipped."""
    base = model.model
    n, s, _ = x.shape
    cos, sin = base.rotary_emb(x, pos)
    last = len(base.layers) - 1
    for i, layer in enumerate(base.layers):
        a = layer.self_attn
        cut = keep_from if i == last else 0
        h = layer.input_layernorm(x)
        q = a.q_proj(h[:, cut:] if cut else h).view(n, s - cut, -1, a.head_dim)
        k = a.k_proj(h).view(n, s, -1, a.head_dim)
        v = a.v_proj(h).view(n, s, -1, a.head_dim)
        if hasattr(a, "q_norm"):  # Qwen3: per-head norms before the rotation
            q, k = a.q_norm(q), a.k_norm(k)
        o = attend(i, _rotate(q.transpose(1, 2), cos[:, cut:], sin[:, cut:]),
                   _rotate(k.transpose(1, 2), cos, sin), v.transpose(1, 2))
        x = (x[:, cut:] if cut else x) + a.o_proj(o.transpose(1, 2).reshape(n, s - cut, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return base.norm(x)


def attention(model, q, k, v, mask):
    """softmax(q k^T scale, masked) v for q (n, heads, s, d), k, v (n, kv_heads, S, d),
    mask (n, 1, s or 1, S) bool; query heads share key heads in consecutive groups."""
    scale = model.model.layers[0].self_attn.scaling
    n, heads, s, d = q.shape
    if s > 1:
        return scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                            enable_gqa=heads != k.shape[1])
    # One query per row (decoding): two batched products beat the fused kernel, which is
    # tiled for many queries (~25% less time at 256 rows x 70 keys here).
    kv = k.shape[1]
    scores = torch.matmul(q.reshape(n, kv, heads // kv, d), k.transpose(-1, -2)) * scale
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.matmul(weights, v).reshape(n, heads, 1, d)


def prompt_mask(mask: torch.Tensor) -> torch.Tensor:
    """Attention mask (n, 1, w, w) of left-padded prompts with key mask ``mask`` (n, w):
    causal over real tokens; a padding query sees itself only (never an empty row, never
    read by a real token)."""
    w = mask.shape[1]
    causal = torch.ones((w, w), dtype=torch.bool, device=mask.device).tril()
    eye = torch.eye(w, dtype=torch.bool, device=mask.device)
    return ((causal & mask.bool()[:, None, :]) | eye)[:, None]


def unique_prompts(prompts) -> tuple[list, torch.Tensor]:
    """(distinct prompts in order of first appearance, index (n,) of each row's prompt)."""
    first: dict[tuple, int] = {}
    index = [first.setdefault(tuple(p), len(first)) for p in prompts]
    return [list(p) for p in first], torch.tensor(index, dtype=torch.long)


def left_pad(prompts, pad_id: int, device, width: int = 0):
    """(ids, mask, positions), each (n, w): prompts left-padded to the longest, or to
    ``width`` tokens where that is more; positions count real tokens from 0."""
    width = max(width, max(len(p) for p in prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@dataclass
class DecodeCache:
    """Key/value cache of a decoder: per layer (rows, kv_heads, columns, head_dim) keys and
    values, and ``valid`` (rows, columns): which columns may be attended to (each row's real
    prompt tokens, then every new token)."""

    keys: list
    values: list
    valid: torch.Tensor

    @classmethod
    def allocate(cls, model, rows: int, columns: int, device, fill=torch.empty):
        """A cache of ``rows`` x ``columns`` for ``model`` in its embedding dtype; ``fill``
        torch.empty or torch.zeros (a cache whose unwritten columns are read, masked, by a
        static-shape step: 0 x uninitialised memory may be NaN)."""
        base = model.model
        a = base.layers[0].self_attn
        shape = (rows, a.k_proj.out_features // a.head_dim, columns, a.head_dim)
        dtype = base.embed_tokens.weight.dtype
        return cls(keys=[fill(shape, dtype=dtype, device=device) for _ in base.layers],
                   values=[fill(shape, dtype=dtype, device=device) for _ in base.layers],
                   valid=torch.ones((rows, columns), dtype=torch.bool, device=device))


class StaticDecoder:
    """Prefill and one-token decoding steps with a preallocated key/value cache.

    prompts: token-id lists (n rows; equal prompts are computed once). ``prefill`` returns
    the next-token logits after each prompt, ``step`` those after each new token.
    width: prompts are left-padded to at least this many tokens. cache: a ``DecodeCache`` of
    exactly n rows and width + max_new columns to fill (kept across calls by
    ``samplers.graphs``), or None: one is allocated. compiled: the fused step (where it
    applies, see below) through ``decode_step.compiled_step``.
    """

    def __init__(self, model, prompts, max_new: int, pad_id: int, device, width: int = 0,
                 cache: DecodeCache | None = None, compiled: bool = False):
        self.model = model
        distinct, self.row = unique_prompts(prompts)
        self.row = self.row.to(device)
        self.ids, mask, self.pos = left_pad(distinct, pad_id, device, width)
        n, w = len(prompts), self.ids.shape[1]
        if cache is None:
            cache = DecodeCache.allocate(model, n, w + max_new, device)
        elif cache.valid.shape != (n, w + max_new):
            raise ValueError(f"cache must have {n} rows and {w + max_new} columns, got "
                             f"{tuple(cache.valid.shape)}")
        # Own lists: ``keep`` replaces their tensors, never the cache's.
        self.keys, self.values, self.valid = list(cache.keys), list(cache.values), cache.valid
        self.valid[:, :w] = mask.bool()[self.row]
        self.valid[:, w:] = True
        self.width = w
        self._prompt_mask = prompt_mask(mask)
        # The step in fewer operators (``decode_step``) where the layout and cache allow it;
        # on a CPU only, where it was measured (a GPU replays graphed steps, samplers.graphs).
        layout = fusable(model)
        whole = all(t.is_contiguous() for t in (*self.keys, *self.values))
        self.fused = FusedStep.of(model, layout, int(self.pos.max()) + max_new + 1, device) \
            if layout is not None and whole and torch.device(device).type == "cpu" else None
        self._fused_step = compiled_step if compiled else fused_step

    def next_positions(self) -> torch.Tensor:
        """Position (n, 1) of the first new token of each row."""
        return self.pos[self.row, -1:] + 1

    def prefill(self):
        """Next-token logits (n, V) after each row's prompt."""
        w = self.width

        def attend(i, q, k, v):
            self.keys[i][:, :, :w] = k[self.row]
            self.values[i][:, :, :w] = v[self.row]
            return attention(self.model, q, k, v, self._prompt_mask)
        hidden = run_layers(self.model, self.model.model.embed_tokens(self.ids), self.pos,
                            attend)
        return self.model.lm_head(hidden[:, -1])[self.row]

    def step(self, tok, pos, t: int):
        """Next-token logits (n, V) after new token number ``t`` (from 0), ``tok`` (n, 1) at
        positions ``pos`` (n, 1)."""
        end = self.width + t + 1
        if self.fused is not None:
            if self.fused.bias is None:
                self.fused.bias = mask_bias(self.valid, self.fused.layout.kv_heads,
                                            self.keys[0].dtype)
            return self._fused_step(self.model, self.fused, tok, pos, self.keys, self.values,
                                    end)
        mask = self.valid[:, None, None, :end]

        def attend(i, q, k, v):
            self.keys[i][:, :, end - 1:end] = k
            self.values[i][:, :, end - 1:end] = v
            return attention(self.model, q, self.keys[i][:, :, :end],
                              self.values[i][:, :, :end], mask)
        hidden = run_layers(self.model, self.model.model.embed_tokens(tok), pos, attend)
        return self.model.lm_head(hidden[:, -1])

    def keep(self, rows: torch.Tensor) -> torch.Tensor:
        """Keep only ``rows`` (indices into the current rows, after ``prefill``): later
        steps take and return those rows only (finished sequences stop costing compute).
        Returns the rows kept (``rows``)."""
        # Layer by layer, so that at most one layer's old cache is held beside the new one.
        for cache in (self.keys, self.values):
            for i, layer in enumerate(cache):
                cache[i] = layer.index_select(0, rows)
        self.valid = self.valid.index_select(0, rows)
        if self.fused is not None:
            self.fused.bias = None  # remade for the rows kept
        return rows


def _shared_prompt_states(model, batch):
    """(prompt_last (U, h), completion (n, L-1, h) or None): final-normed hidden states of a
    ``losses.PromptBatch``, the prompt segment once per distinct prompt (its last state
    predicts completion token 0), the completion segment per row."""
    keys, values = [], []

    def attend_prompt(i, q, k, v):
        keys.append(k)
        values.append(v)
        return attention(model, q, k, v, batch.prompt_attention)

    embed = model.model.embed_tokens
    prompt_hidden = run_layers(model, embed(batch.prompt_ids), batch.prompt_pos, attend_prompt)
    if batch.targets.shape[1] == 1:
        return prompt_hidden[:, -1], None
    row = batch.row

    def attend_completion(i, q, k, v):
        return attention(model, q, torch.cat([keys[i][row], k], 2),
                          torch.cat([values[i][row], v], 2), batch.completion_attention)

    # Completion tokens 0..L-2 predict tokens 1..L-1.
    return prompt_hidden[:, -1], run_layers(model, embed(batch.targets[:, :-1]),
                                            batch.completion_pos, attend_completion)


def shared_prompt_logits(model, batch):
    """Logits (n, L, V) predicting each completion token of a ``losses.PromptBatch``: the
    prompt segment once per distinct prompt, the completion segment per row."""
    prompt_last, hidden = _shared_prompt_states(model, batch)
    first = model.lm_head(prompt_last)[batch.row]  # predicts completion token 0
    if hidden is None:
        return first[:, None]
    return torch.cat([first[:, None], model.lm_head(hidden)], 1)


def shared_prompt_hidden(model, batch):
    """Final-normed hidden states (n, L, h) whose ``lm_head`` gives the logits of
    ``shared_prompt_logits`` (for a head applied in chunks, ``losses.chunked_logprobs``)."""
    prompt_last, hidden = _shared_prompt_states(model, batch)
    first = prompt_last[batch.row][:, None]
    return first if hidden is None else torch.cat([first, hidden], 1)


def sequence_hidden(model, batch):
    """Final-normed hidden states (n, L, h) predicting each completion token of a
    ``losses.SequenceBatch``: every row's prompt and completion in one forward (no prompt
    shared between rows), the last layer only from the position that predicts completion
    token 0 on (``run_layers``' ``keep_from``)."""
    mask = batch.attention

    def attend(i, q, k, v):
        return attention(model, q, k, v, mask[:, :, -q.shape[2]:])
    return run_layers(model, model.model.embed_tokens(batch.input_ids), batch.positions, attend,
                      keep_from=batch.first)


def sequence_logits(model, batch):
    """Logits (n, L, V) predicting each completion token of a ``losses.SequenceBatch``."""
    return model.lm_head(sequence_hidden(model, batch))
