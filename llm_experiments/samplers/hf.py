"""HF/torch sampler with a KV cache and inverse-CDF sampling (CPU and GPU).

Prompts are left-padded, positions count real tokens only, so a completion is scored exactly
as the trainer scores it (prompt at position 0, no padding before it). Each step draws the
next token from softmax(logits / temperature), truncated to the nucleus ``top_p`` if < 1, by
inverse CDF over the vocabulary order with one uniform per (sequence, position): passing the
same uniforms to two weight versions couples their samples (common random numbers).
"""

from __future__ import annotations

import copy
import inspect

import numpy as np
import torch

from ..policy.decode_step import CXX_COMPILERS, cxx_compiler
from ..policy.direct import StaticDecoder, left_pad, supports
from . import CDF_DTYPES, DECODE_GRAPHS, Generation, WeightUpdate
from .graphs import GraphedDecoder


def step_distribution(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs (float32) of the sampling distribution at one position: temperature, then
    nucleus truncation to the smallest top set of mass >= top_p (renormalised)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = torch.sort(logp, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_logp.exp(), dim=-1) - sorted_logp.exp()
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def _below(x: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """x capped strictly below ``total``: a uniform that rounds up to the total mass must
    still land in a token of positive probability (the cdf is flat after the last one)."""
    return torch.minimum(x, torch.nextafter(total, torch.zeros_like(total)))


def inverse_cdf(logp: torch.Tensor, u: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Token ids (n,) with P(id) = exp(logp) from uniforms u in [0, 1) (one per row).

    dtype of the cumulative sum: float64 (the reference; exact to ~1e-16 per bin edge) or
    float32, whose sequential rounding moves each bin edge by up to ~1e-7 of the total mass:
    with the same uniform a different token than float64's with probability up to the sum of
    the edge shifts (1.5e-3 to 4.4e-3 measured over 151,936 tokens), and a token of probability below
    the float32 spacing of the cdf at its edge (~6e-8 near the end) is drawn at a wrong rate.
    """
    cdf = torch.cumsum(logp.exp().to(dtype), dim=-1)
    x = _below(u.to(dtype) * cdf[:, -1], cdf[:, -1]).unsqueeze(-1)
    # side="right": a zero-probability token (flat cdf) can never be selected.
    return torch.searchsorted(cdf, x, right=True).squeeze(-1)


def blocked_inverse_cdf(logp: torch.Tensor, u: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """``inverse_cdf`` without a float64 sum over the vocabulary: float32 cumulative sums
    within blocks of ``block`` tokens (>= 1), float64 only over the V / block block masses.

    The uniform picks a block by the float64 sum of block masses, then a token inside it by
    the block's float32 cdf. A bin edge moves by the float32 rounding of its block's sums
    (relative to the block's mass, not the total's as in a float32 sum over the vocabulary):
    over 151,936 tokens (four random distributions) the same uniform picks a different token
    than the float64 reference with probability at most 1e-5 to 2e-4 (the sum of the edge
    shifts), against 1.5e-3 to 4.4e-3 for ``inverse_cdf`` in float32, and the rates of the
    rarest tokens are kept to the float32 spacing of their block's cdf. The caller's
    log-prob of the chosen token (read from ``logp``) is exact whichever token is chosen.
    """
    n, vocab = logp.shape
    p = logp.exp().float()
    pad = -vocab % block
    inner = torch.cumsum(torch.nn.functional.pad(p, (0, pad)).view(n, -1, block), dim=-1)
    outer = torch.cumsum(inner[..., -1].double(), dim=-1)  # (n, blocks)
    x = _below(u.double() * outer[:, -1], outer[:, -1])
    # side="right": a block (then a token) of zero mass is never selected.
    j = torch.searchsorted(outer, x[:, None], right=True)
    start = torch.cat([torch.zeros_like(outer[:, :1]), outer], -1).gather(-1, j)
    cdf = inner[torch.arange(n, device=p.device), j.squeeze(-1)]  # (n, block) float32
    r = _below((x[:, None] - start).float(), cdf[:, -1:])
    return j.squeeze(-1) * block + torch.searchsorted(cdf, r, right=True).squeeze(-1)


def sample_step(logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor,
                cdf: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids (n,), their float32 log-probs under the sampling distribution (n,)) for
    next-token logits (n, V): greedy at temperature 0, else ``step_distribution`` sampled by
    the uniforms u (n,) through ``inverse_cdf`` (cdf "float64" or "float32") or
    ``blocked_inverse_cdf`` (cdf "blocked")."""
    if temperature == 0.0:
        logp = torch.log_softmax(logits.float(), dim=-1)
        tok = logp.argmax(-1)
    else:
        logp = step_distribution(logits, temperature, top_p)
        tok = blocked_inverse_cdf(logp, u) if cdf == "blocked" else \
            inverse_cdf(logp, u, getattr(torch, cdf))
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1).float()


class GenericDecoder:
    """The interface of ``direct.StaticDecoder`` over the model's generic forward and its
    growing cache (any architecture)."""

    def __init__(self, model, prompts, pad_id: int, device):
        self.model = model
        self.ids, self.mask, self.pos = left_pad(prompts, pad_id, device)
        params = inspect.signature(model.forward).parameters
        # transformers >= 5.24 renamed past_key_values to cache.
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.cache = None

    def _forward(self, ids, pos):
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos,
                         use_cache=True,
                         **({self.cache_kw: self.cache} if self.cache is not None else {}))
        self.cache = out.get("cache") if "cache" in out else out.get("past_key_values")
        return out.logits[:, -1]

    def next_positions(self) -> torch.Tensor:
        """Position (n, 1) of the first new token of each row."""
        return self.pos[:, -1:] + 1

    def prefill(self):
        """Next-token logits (n, V) after each prompt."""
        return self._forward(self.ids, self.pos)

    def step(self, tok, pos, t: int):
        """Next-token logits (n, V) after new token ``tok`` (n, 1)."""
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        return self._forward(tok, pos)

    def keep(self, rows: torch.Tensor) -> torch.Tensor:
        """Drop every row but ``rows`` (indices into the current rows) from the cache;
        returns ``rows``."""
        self.mask = self.mask[rows]
        self.cache.batch_select_indices(rows)
        return rows


# Decode steps between checks whether every row has ended: a check waits for the device
# (a host sync), which on a GPU costs more than a few decode steps of finished rows.
CHECK_EVERY = {"cpu": 1, "cuda": 16}


class HFSampler:
    """Sampler over its own copy of a transformers causal LM.

    direct: decode with ``direct.StaticDecoder`` where it supports the model (static cache,
    each distinct prompt prefilled once), else through the generic forward. dtype: of the
    sampler's copy (None = the model's; weights loaded later are cast to it).
    compact_below: share of the decoder's rows still unfinished, in [0, 1], at or under which
    the finished rows are dropped from the cache at a completion check (0 = never); each row keeps
    its own uniforms, so the samples do not depend on it (bitwise on CPU, tests/llm/
    test_gpu_decode.py). cdf: ``CDF_DTYPES``, the inverse-CDF sum ("auto": float64 on CPU,
    "blocked" elsewhere; see ``inverse_cdf`` and ``blocked_inverse_cdf`` for their errors).
    graphs: ``DECODE_GRAPHS``, static-shape decode steps kept across calls
    (``graphs.GraphedDecoder``; direct decoding only): "on" (captured as CUDA graphs on a
    GPU, run eagerly elsewhere), "off", or "auto" = on on a GPU, off elsewhere. The kept
    cache stays on the device between calls (~32 GB at 256 rows x 1,100 columns of a
    Qwen3-0.6B shape in bf16); a trainer on the same device budgets around it
    (``memory.budget_bytes``).
    max_concurrent: the most sequences decoded at once (>= 0; 0 = all rows of a call): a
    call with more rows decodes them in consecutive waves of at most this many. It models a
    serving engine whose KV-cache memory holds only so many sequences: on a GPU decoding is
    memory-bound, so that limit, not the FLOPs, sets generation's time. Each row keeps its
    own uniforms, so the samples do not depend on it (up to float rounding of the batch
    shape). Waves are static, not continuously refilled: equal to a continuous-batching
    engine's schedule when completions have about the same length. With graphed decoding
    the rows of each wave run in the cache's power-of-two buckets, shared by every call.
    compile_step: decode with ``decode_step.compiled_step`` where the fused step applies
    (direct decoding on a CPU, graphs off, a Llama/Qwen2 layout; elsewhere it changes
    nothing): fewer seconds per step after a compile of tens of seconds per process, the
    samples those of the eager step up to float32 rounding. Needs a C++ compiler.
    """

    def __init__(self, model, eos_id: int, pad_id: int, direct: bool = True, dtype=None,
                 compact_below: float = 0.0, cdf: str = "auto", graphs: str = "auto",
                 max_concurrent: int = 0, compile_step: bool = False):
        if not 0.0 <= compact_below <= 1.0:
            raise ValueError(f"compact_below must be in [0, 1], got {compact_below}")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) \
                or max_concurrent < 0:
            raise ValueError(f"max_concurrent must be an integer >= 0, got {max_concurrent!r}")
        if cdf not in CDF_DTYPES:
            raise ValueError(f"cdf must be one of {CDF_DTYPES}, got {cdf!r}")
        if graphs not in DECODE_GRAPHS:
            raise ValueError(f"graphs must be one of {DECODE_GRAPHS}, got {graphs!r}")
        self.model = copy.deepcopy(model).eval()
        if compile_step and self.device.type == "cpu" and cxx_compiler() is None:
            raise ValueError(f"compile_step=True needs a C++ compiler on PATH (one of "
                             f"{', '.join(CXX_COMPILERS)}); none was found")
        if dtype is not None:
            self.model.to(dtype=dtype)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.eos_id, self.pad_id = int(eos_id), int(pad_id)
        self.version = -1
        self.direct = bool(direct) and supports(self.model)
        self.compact_below, self.cdf, self.graphs = float(compact_below), cdf, graphs
        self.max_concurrent, self.compile_step = max_concurrent, bool(compile_step)
        self._graphed = None  # the GraphedDecoder, kept across calls
        self._own = self.model.state_dict()  # views of the weights, for load_weights

    @property
    def device(self) -> torch.device:
        """Device of the sampler's weights."""
        return next(self.model.parameters()).device

    def load_weights(self, update: WeightUpdate) -> None:
        """See ``Sampler.load_weights``. A state with exactly the model's keys and shapes is
        copied tensor by tensor (``load_state_dict``'s module walk costs more than the copy
        for small models); anything else goes through ``load_state_dict`` and its checks."""
        state = update.state
        with torch.no_grad():
            if state.keys() == self._own.keys() and all(
                    t.shape == state[k].shape for k, t in self._own.items()):
                for k, t in self._own.items():
                    t.copy_(state[k])
            else:
                self.model.load_state_dict(state)
        self.version = int(update.version)

    def _uniforms(self, n: int, max_new_tokens: int, seed: int, uniforms) -> torch.Tensor:
        """The (n, max_new_tokens) float64 uniforms on the device: given, or drawn upfront
        from ``seed`` (row i's draws are row i's whatever the other rows do)."""
        if uniforms is None:
            gen = torch.Generator().manual_seed(int(seed))
            u_all = torch.rand((n, max_new_tokens), generator=gen, dtype=torch.float64)
        else:
            u_all = torch.as_tensor(np.asarray(uniforms), dtype=torch.float64)
            if u_all.shape != (n, max_new_tokens):
                raise ValueError(f"uniforms must have shape ({n}, {max_new_tokens}), got "
                                 f"{tuple(u_all.shape)}")
        return u_all.to(self.device)

    def _decoder(self, prompts, max_new_tokens: int, dev: torch.device):
        """The decoder of this call: graphed (kept across calls), static or generic."""
        if not self.direct:
            return GenericDecoder(self.model, prompts, self.pad_id, dev)
        if self.graphs == "on" or (self.graphs == "auto" and dev.type == "cuda"):
            capture = dev.type == "cuda"
            if self._graphed is None or self._graphed.capture != capture:
                self._graphed = GraphedDecoder(self.model, capture)
            return self._graphed.start(prompts, max_new_tokens, self.pad_id, dev)
        return StaticDecoder(self.model, prompts, max_new_tokens, self.pad_id, dev,
                             compiled=self.compile_step)

    def generate(self, prompts, *, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, seed: int = 0, uniforms=None) -> Generation:
        """See ``Sampler.generate``; rows beyond ``max_concurrent`` wait for a later wave."""
        u_all = self._uniforms(len(prompts), max_new_tokens, seed, uniforms)
        wave = self.max_concurrent or len(prompts)
        if len(prompts) <= wave:
            return self._decode(prompts, max_new_tokens, temperature, top_p, u_all)
        parts = [self._decode(prompts[i:i + wave], max_new_tokens, temperature, top_p,
                              u_all[i:i + wave]) for i in range(0, len(prompts), wave)]
        return Generation(*(np.concatenate([getattr(g, f) for g in parts]) for f in
                            ("tokens", "logprobs", "lengths", "finished")))

    @torch.no_grad()
    def _decode(self, prompts, max_new_tokens: int, temperature: float, top_p: float,
                u_all: torch.Tensor) -> Generation:
        """One wave: every row of ``prompts`` decoded at once with its row of ``u_all``."""
        # On a CPU in inference mode too: it skips autograd's version counters and dispatch,
        # 11-18% more tokens/s at cpu_long's shape, where a step is ~250 small operators.
        # Not measured on a GPU, whose steps replay CUDA graphs.
        with torch.inference_mode(self.device.type == "cpu"):
            return self._decode_wave(prompts, max_new_tokens, temperature, top_p, u_all)

    def _decode_wave(self, prompts, max_new_tokens: int, temperature: float, top_p: float,
                     u_all: torch.Tensor) -> Generation:
        """``_decode``'s work, under its grad mode."""
        n, dev = len(prompts), self.device
        decoder = self._decoder(prompts, max_new_tokens, dev)
        logits = decoder.prefill()
        next_pos = decoder.next_positions()
        # Outputs stay on the device and are written whole columns at a time; ``rows`` maps
        # the decoder's rows to the outputs' (all of them until a compaction).
        tokens = torch.full((n, max_new_tokens), self.pad_id, dtype=torch.long, device=dev)
        logprobs = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=dev)
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        lengths = torch.full((n,), max_new_tokens, dtype=torch.long, device=dev)
        rows = torch.arange(n, device=dev)
        check = CHECK_EVERY.get(dev.type, 1)
        cdf = self.cdf if self.cdf != "auto" else "float64" if dev.type == "cpu" else "blocked"
        for t in range(max_new_tokens):
            tok, lp = sample_step(logits, temperature, top_p, u_all[rows, t], cdf)
            live = ~done[rows]
            tokens[rows, t] = torch.where(live, tok, self.pad_id)
            logprobs[rows, t] = torch.where(live, lp, 0.0)
            ended = live & (tok == self.eos_id)
            lengths[rows] = torch.where(ended, t + 1, lengths[rows])
            done[rows] = ~live | ended
            if t == max_new_tokens - 1:
                break
            # Finished rows decode on until a check (a host sync); they write pad and 0.
            if (t + 1) % check == 0:
                alive = ~done[rows]
                left = int(alive.sum())
                if left == 0:
                    break
                if left < len(rows) and left <= self.compact_below * len(rows):
                    keep = decoder.keep(alive.nonzero().squeeze(-1))
                    rows, tok, next_pos = rows[keep], tok[keep], next_pos[keep]
            logits = decoder.step(tok[:, None], next_pos, t)
            next_pos = next_pos + 1
        return Generation(tokens.cpu().numpy().astype(np.int32), logprobs.cpu().numpy(),
                          lengths.cpu().numpy().astype(np.int32), done.cpu().numpy())
