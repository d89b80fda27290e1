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

from ..policy.direct import StaticDecoder, left_pad, supports
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


def inverse_cdf(logp: torch.Tensor, u: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """Token ids with P(id) = exp(logp) from uniforms u in [0, 1) (one per row). dtype of
    the cumulative sum: float64 (the reference), or float32 on a GPU, where a float64 sum
    over the vocabulary every token is slow (~1e-7 relative error per token's bin edge;
    picks the same token except for uniforms within that of an edge)."""
    cdf = torch.cumsum(logp.exp().to(dtype), dim=-1)
    x = (u.to(dtype) * cdf[:, -1]).unsqueeze(-1)
    # side="right": a zero-probability token (flat cdf) can never be selected.
    idx = torch.searchsorted(cdf, x, right=True).squeeze(-1)
    return idx.clamp(max=logp.shape[-1] - 1)


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


# Decode steps between checks whether every row has ended: a check waits for the device
# (a host sync), which on a GPU costs more than a few decode steps of finished rows.
CHECK_EVERY = {"cpu": 1, "cuda": 16}


class HFSampler:
    """Sampler over its own copy of a transformers causal LM.

    direct: decode with ``direct.StaticDecoder`` where it supports the model (static cache,
    each distinct prompt prefilled once), else through the generic forward. dtype: of the
    sampler's copy (None = the model's; weights loaded later are cast to it).
    """

    def __init__(self, model, eos_id: int, pad_id: int, direct: bool = True, dtype=None):
        self.model = copy.deepcopy(model).eval()
        if dtype is not None:
            self.model.to(dtype=dtype)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.eos_id, self.pad_id = int(eos_id), int(pad_id)
        self.version = -1
        self.direct = bool(direct) and supports(self.model)
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
        u_all = u_all.to(dev)
        decoder = StaticDecoder(self.model, prompts, max_new_tokens, self.pad_id, dev) \
            if self.direct else GenericDecoder(self.model, prompts, self.pad_id, dev)
        logits = decoder.prefill()
        next_pos = decoder.next_positions()
        # Outputs stay on the device and are written whole columns at a time.
        tokens = torch.full((n, max_new_tokens), self.pad_id, dtype=torch.long, device=dev)
        logprobs = torch.zeros((n, max_new_tokens), dtype=torch.float32, device=dev)
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        lengths = torch.full((n,), max_new_tokens, dtype=torch.long, device=dev)
        check = CHECK_EVERY.get(dev.type, 1)
        cdf_dtype = torch.float64 if dev.type == "cpu" else torch.float32
        for t in range(max_new_tokens):
            if temperature == 0.0:
                logp = torch.log_softmax(logits.float(), dim=-1)
                tok = logp.argmax(-1)
            else:
                logp = step_distribution(logits, temperature, top_p)
                tok = inverse_cdf(logp, u_all[:, t], cdf_dtype)
            lp = logp.gather(-1, tok[:, None]).squeeze(-1).float()
            live = ~done
            tokens[:, t] = torch.where(live, tok, self.pad_id)
            logprobs[:, t] = torch.where(live, lp, 0.0)
            ended = live & (tok == self.eos_id)
            lengths = torch.where(ended, t + 1, lengths)
            done |= ended
            # Finished rows keep decoding until the next check; they write pad and 0.
            if t == max_new_tokens - 1 or ((t + 1) % check == 0 and bool(done.all())):
                break
            logits = decoder.step(tok[:, None], next_pos, t)
            next_pos = next_pos + 1
        return Generation(tokens.cpu().numpy().astype(np.int32), logprobs.cpu().numpy(),
                          lengths.cpu().numpy().astype(np.int32), done.cpu().numpy())
