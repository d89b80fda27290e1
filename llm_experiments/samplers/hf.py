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

from . import Generation, WeightUpdate


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


def inverse_cdf(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids with P(id) = exp(logp) from uniforms u in [0, 1) (one per row)."""
    cdf = torch.cumsum(logp.exp().double(), dim=-1)
    x = (u.double() * cdf[:, -1]).unsqueeze(-1)
    # side="right": a zero-probability token (flat cdf) can never be selected.
    idx = torch.searchsorted(cdf, x, right=True).squeeze(-1)
    return idx.clamp(max=logp.shape[-1] - 1)


class HFSampler:
    """Sampler over its own copy of a transformers causal LM."""

    def __init__(self, model, eos_id: int, pad_id: int):
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.eos_id, self.pad_id = int(eos_id), int(pad_id)
        self.version = -1
        params = inspect.signature(self.model.forward).parameters
        # transformers >= 5.24 renamed past_key_values to cache.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def device(self) -> torch.device:
        """Device of the sampler's weights."""
        return next(self.model.parameters()).device

    def load_weights(self, update: WeightUpdate) -> None:
        """See ``Sampler.load_weights``."""
        with torch.no_grad():
            self.model.load_state_dict(update.state)
        self.version = int(update.version)

    def _forward(self, ids, mask, pos, cache):
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         **({self._cache_kw: cache} if cache is not None else {}))
        new_cache = out.get("cache") if "cache" in out else out.get("past_key_values")
        return out.logits[:, -1], new_cache

    @torch.no_grad()
    def generate(self, prompts, *, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, seed: int = 0, uniforms=None) -> Generation:
        """See ``Sampler.generate``."""
        n, dev = len(prompts), self.device
        if uniforms is None:
            gen = torch.Generator().manual_seed(int(seed))
            u_all = torch.rand((n, max_new_tokens), generator=gen, dtype=torch.float64)
        else:
            u_all = torch.as_tensor(np.asarray(uniforms), dtype=torch.float64)
            if u_all.shape != (n, max_new_tokens):
                raise ValueError(f"uniforms must have shape ({n}, {max_new_tokens}), got "
                                 f"{tuple(u_all.shape)}")
        width = max(len(p) for p in prompts)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(ids, mask, pos, None)
        next_pos = pos[:, -1:] + 1
        tokens = torch.full((n, max_new_tokens), self.pad_id, dtype=torch.long)
        logprobs = torch.zeros((n, max_new_tokens), dtype=torch.float32)
        done = torch.zeros(n, dtype=torch.bool)
        lengths = torch.full((n,), max_new_tokens, dtype=torch.long)
        for t in range(max_new_tokens):
            if temperature == 0.0:
                logp = torch.log_softmax(logits.float(), dim=-1)
                tok = logp.argmax(-1)
            else:
                logp = step_distribution(logits, temperature, top_p)
                tok = inverse_cdf(logp, u_all[:, t].to(dev))
            lp = logp.gather(-1, tok[:, None]).squeeze(-1).float().cpu()
            tok_cpu, live = tok.cpu(), ~done
            tokens[live, t] = tok_cpu[live]
            logprobs[live, t] = lp[live]
            ended = live & (tok_cpu == self.eos_id)
            lengths[ended] = t + 1
            done |= ended
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=dev)], dim=1)
            logits, cache = self._forward(tok[:, None], mask, next_pos, cache)
            next_pos = next_pos + 1
        return Generation(tokens.numpy().astype(np.int32), logprobs.numpy(),
                          lengths.numpy().astype(np.int32), done.numpy().copy())
