"""Policy-gradient losses on replayed rollouts (theory.md section 6).

Every loss is a mean over sequences of a per-sequence loss, so the batch gradient is exactly
the mean of per-sample gradients (what the theory's g_t = mean of B estimates assumes, and
what the probes measure; ``gradients.py`` computes them). Tokens after the first
end-of-sequence are masked out.

* the losses with an importance ratio r = pi / pi_behaviour (``objectives``: grpo, the PPO
  clip; grpo_unclipped; grpo_truncated, TIS; cispo; m2po; neg_clip, neg_cap, neg_veto), their
  token losses averaged over the sequence's tokens (cispo and m2po: over the batch's tokens,
  as their sources do); no KL term.
* ``asymre``: -(reward - (V_hat + dV)) log pi(z | q), V_hat the group mean reward, no ratio;
  log pi(z | q) is the sum over tokens, divided by the constant ``max_new_tokens`` to keep the
  learning-rate scale of the other losses without favouring short answers.

The advantage is computed once per rollout at generation (``group_advantages``) and replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np
import torch

from .choices import LAYOUTS, LOSSES, RATIO_LOSSES
from .objectives import BatchTerms, LossParams, batch_terms, token_terms


def group_advantages(rewards, loss: str = "grpo", dv: float = -0.1) -> np.ndarray:
    """Advantages of a (groups, G) reward array.

    GRPO family: (r - mean) / std within the group (population std); a group whose rewards are
    all equal gets 0 (no signal, and no NaN). AsymRE: r - (mean + dv).
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] < 2:
        raise ValueError(f"rewards must be a (groups, G >= 2) array, got shape {r.shape}")
    mean = r.mean(axis=1, keepdims=True)
    if loss == "asymre":
        return r - (mean + dv)
    std = r.std(axis=1, keepdims=True)
    return np.where(std > 0, (r - mean) / np.where(std > 0, std, 1.0), 0.0)


@dataclass
class _Rows:
    """What the loss needs of each rollout, in both batch layouts: targets, mask (n, L)
    completion tokens and validity; old_logp (n, L) behaviour log-probs; adv (n,)
    advantages. ``rows`` slices every field but those named in ``SHARED``."""

    targets: torch.Tensor
    mask: torch.Tensor
    old_logp: torch.Tensor
    adv: torch.Tensor
    SHARED: ClassVar[tuple] = ()

    def __len__(self) -> int:
        return self.targets.shape[0]

    def rows(self, sl: slice):
        """The sub-batch of rows ``sl``."""
        return type(self)(**{f.name: getattr(self, f.name) if f.name in self.SHARED
                             else getattr(self, f.name)[sl] for f in fields(self)})


@dataclass
class TokenBatch(_Rows):
    """A batch of rollouts as full sequences, prompt at position 0, right-padded: input_ids
    (n, W); index (n, L): position of the logits that predict completion token k."""

    input_ids: torch.Tensor = None
    index: torch.Tensor = None


def _completion_rows(rollouts, pad_id: int, device) -> dict:
    """The ``_Rows`` fields of a batch of ``buffer.Rollout`` records, as tensors."""
    n, length = len(rollouts), max(len(r.completion) for r in rollouts)
    targets = np.full((n, length), pad_id, dtype=np.int64)
    mask = np.zeros((n, length), dtype=bool)
    old = np.zeros((n, length), dtype=np.float32)
    for i, r in enumerate(rollouts):
        c = len(r.completion)
        targets[i, :c] = r.completion
        mask[i, :c] = True
        old[i, :c] = r.logprobs
    adv = np.array([r.advantage for r in rollouts], dtype=np.float32)
    return {k: torch.as_tensor(a, device=device)
            for k, a in (("targets", targets), ("mask", mask), ("old_logp", old), ("adv", adv))}


def collate(rollouts, pad_id: int, device="cpu") -> TokenBatch:
    """Build a ``TokenBatch`` from ``buffer.Rollout`` records."""
    n = len(rollouts)
    width = max(len(r.prompt) + len(r.completion) for r in rollouts)
    length = max(len(r.completion) for r in rollouts)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    index = np.zeros((n, length), dtype=np.int64)
    for i, r in enumerate(rollouts):
        p, c = len(r.prompt), len(r.completion)
        ids[i, :p] = r.prompt
        ids[i, p:p + c] = r.completion
        index[i] = np.minimum(np.arange(length) + p - 1, width - 2)
    return TokenBatch(**_completion_rows(rollouts, pad_id, device),
                      input_ids=torch.as_tensor(ids, device=device),
                      index=torch.as_tensor(index, device=device))


def target_logprobs(picked: torch.Tensor, targets: torch.Tensor, temperature: float):
    """(log-probs, entropies), each (n, L), of ``targets`` (n, L) under softmax(picked / T),
    ``picked`` (n, L, V) the logits that predict them. The entropy is a diagnostic, computed
    outside the autograd graph (its graph would hold two more (n, L, V) float32 tensors)."""
    logp_all = torch.log_softmax(picked.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def chunked_logprobs(head: torch.Tensor, hidden: torch.Tensor, targets: torch.Tensor,
                     temperature: float, chunk: int):
    """``target_logprobs`` of the logits ``hidden @ head.T`` computed ``chunk`` (>= 1) tokens
    at a time: head (V, h) the output layer's weight, hidden (n, L, h) the states that
    predict targets (n, L). Each chunk's product and softmax
    are recomputed in the backward pass (activation checkpointing), so neither the forward
    nor the graph ever holds more than one chunk's (chunk, V) float32 logits."""
    from torch.utils.checkpoint import checkpoint
    n, length = targets.shape
    flat_h, flat_t = hidden.reshape(n * length, -1), targets.reshape(-1)

    def part(h, t):
        return target_logprobs(torch.nn.functional.linear(h, head), t, temperature)
    outs = [checkpoint(part, flat_h[i:i + chunk], flat_t[i:i + chunk], use_reentrant=False)
            for i in range(0, n * length, chunk)]
    return (torch.cat([o[0] for o in outs]).view(n, length),
            torch.cat([o[1] for o in outs]).view(n, length))


def token_logprobs(logits: torch.Tensor, batch: TokenBatch, temperature: float):
    """(log-probs, entropies), each (n, L), of the completion tokens under softmax(logits/T)."""
    picked = torch.gather(logits, 1, batch.index[..., None].expand(-1, -1, logits.shape[-1]))
    return target_logprobs(picked, batch.targets, temperature)


@dataclass
class PromptBatch(_Rows):
    """A batch of rollouts laid out for ``direct.shared_prompt_logits``: each distinct prompt
    once (U of them), completions per row.

    prompt_ids, prompt_pos (U, P): left-padded prompts and their positions; prompt_attention
    (U, 1, P, P): their attention mask. row (n,): each rollout's prompt. completion_pos
    (n, L-1), completion_attention (n, 1, L-1, P+L-1): completion tokens 0..L-2 (they predict
    tokens 1..L-1), attending to their prompt's real tokens and causally to each other.
    """

    prompt_ids: torch.Tensor = None
    prompt_pos: torch.Tensor = None
    prompt_attention: torch.Tensor = None
    row: torch.Tensor = None
    completion_pos: torch.Tensor = None
    completion_attention: torch.Tensor = None
    SHARED: ClassVar[tuple] = ("prompt_ids", "prompt_pos", "prompt_attention")


def collate_prompts(rollouts, pad_id: int, device="cpu") -> PromptBatch:
    """Build a ``PromptBatch`` from ``buffer.Rollout`` records."""
    from ..policy.direct import left_pad, prompt_mask, unique_prompts
    prompts, row = unique_prompts([r.prompt.tolist() for r in rollouts])
    ids, pmask, ppos = left_pad(prompts, pad_id, device)
    n, length = len(rollouts), max(len(r.completion) for r in rollouts)
    row = row.to(device)
    plen = pmask.sum(1)[row]
    completion_pos = plen[:, None] + torch.arange(length - 1, device=device)
    causal = torch.ones((length - 1, length - 1), dtype=torch.bool, device=device).tril()
    attention = torch.cat([pmask.bool()[row][:, None, :].expand(-1, length - 1, -1),
                           causal.expand(n, -1, -1)], 2)[:, None]
    return PromptBatch(**_completion_rows(rollouts, pad_id, device), prompt_ids=ids,
                       prompt_pos=ppos, prompt_attention=prompt_mask(pmask), row=row,
                       completion_pos=completion_pos, completion_attention=attention)


@dataclass
class SequenceBatch(_Rows):
    """A batch of rollouts laid out for ``direct.sequence_logits``: each row's prompt,
    left-padded to the longest (P columns), then its completion tokens 0..L-2 (they predict
    tokens 1..L-1), in one sequence of W = P + L - 1 columns; no prompt is shared between rows.

    input_ids, positions (n, W); attention (n, 1, W, W): causal over each row's real tokens
    (a padding query sees itself only); first = P - 1: the column whose state predicts
    completion token 0 (columns first..W-1 predict tokens 0..L-1).
    """

    input_ids: torch.Tensor = None
    positions: torch.Tensor = None
    attention: torch.Tensor = None
    first: int = 0
    SHARED: ClassVar[tuple] = ("first",)


def collate_sequences(rollouts, pad_id: int, device="cpu") -> SequenceBatch:
    """Build a ``SequenceBatch`` from ``buffer.Rollout`` records."""
    from ..policy.direct import left_pad, prompt_mask
    rows = _completion_rows(rollouts, pad_id, device)
    ids, pmask, _ = left_pad([r.prompt.tolist() for r in rollouts], pad_id, device)
    completion = rows["targets"][:, :-1]
    ids = torch.cat([ids, completion], 1)
    mask = torch.cat([pmask, torch.ones_like(completion)], 1)
    return SequenceBatch(**rows, input_ids=ids, positions=(mask.cumsum(-1) - 1).clamp(min=0),
                         attention=prompt_mask(mask), first=pmask.shape[1] - 1)


def layout_tokens(rollouts) -> dict:
    """Tokens each layout puts through the model for a batch of ``buffer.Rollout`` records:
    "shared_prompts" U P + n (L - 1) (U distinct prompts, P the longest prompt, L the longest
    completion), "sequences" n (P + L - 1)."""
    n = len(rollouts)
    width = max(len(r.prompt) for r in rollouts)
    length = max(len(r.completion) for r in rollouts)
    distinct = len({r.prompt.tobytes() for r in rollouts})
    return {"shared_prompts": distinct * width + n * (length - 1),
            "sequences": n * (width + length - 1)}


def choose_layout(rollouts, layout: str) -> str:
    """The layout (one of ``LAYOUTS`` but "auto") of one batch: ``layout`` itself, or for
    "auto" "sequences" when its token count is at most ``SEQUENCE_TOKEN_RATIO`` times that of
    "shared_prompts" (its one pass costs less per token than the two passes of the shared
    layout, ``benchmarks/update_cost.py``), else "shared_prompts"."""
    if layout not in LAYOUTS:
        raise ValueError(f"run.train_layout must be one of {list(LAYOUTS)}, got {layout!r}")
    if layout != "auto":
        return layout
    tokens = layout_tokens(rollouts)
    return "sequences" if tokens["sequences"] <= SEQUENCE_TOKEN_RATIO * \
        tokens["shared_prompts"] else "shared_prompts"


# "auto" takes the sequence layout up to this many times the shared layout's tokens.
SEQUENCE_TOKEN_RATIO = 1.0


def collate_direct(rollouts, layout: str, pad_id: int, device="cpu"):
    """A batch of ``buffer.Rollout`` records for the direct forward, in the layout
    ``choose_layout(rollouts, layout)``: a ``PromptBatch`` or a ``SequenceBatch``."""
    make = collate_sequences if choose_layout(rollouts, layout) == "sequences" else \
        collate_prompts
    return make(rollouts, pad_id, device)


def batch_logprobs(model, batch, temperature: float, chunk: int = 0):
    """(log-probs, entropies) (n, L) of a batch's completion tokens under ``model``: through
    ``direct.shared_prompt_logits`` for a ``PromptBatch``, ``direct.sequence_logits`` for a
    ``SequenceBatch``, else the model's own full forward.

    chunk: tokens whose logits are computed at once (``chunked_logprobs``; the model needs
    ``.model`` and ``.lm_head``, as transformers' causal LMs have); 0, or a chunk covering
    the batch, computes all logits at once (bitwise the earlier computation)."""
    if 0 < chunk < batch.targets.numel():
        return chunked_logprobs(model.lm_head.weight, batch_hidden(model, batch), batch.targets,
                                temperature, chunk)
    if isinstance(batch, PromptBatch):
        from ..policy.direct import shared_prompt_logits
        return target_logprobs(shared_prompt_logits(model, batch), batch.targets, temperature)
    if isinstance(batch, SequenceBatch):
        from ..policy.direct import sequence_logits
        return target_logprobs(sequence_logits(model, batch), batch.targets, temperature)
    return token_logprobs(model(input_ids=batch.input_ids).logits, batch, temperature)


def batch_hidden(model, batch) -> torch.Tensor:
    """Final-normed hidden states (n, L, h) that predict a batch's completion tokens."""
    if isinstance(batch, PromptBatch):
        from ..policy.direct import shared_prompt_hidden
        return shared_prompt_hidden(model, batch)
    if isinstance(batch, SequenceBatch):
        from ..policy.direct import sequence_hidden
        return sequence_hidden(model, batch)
    hidden = model.model(input_ids=batch.input_ids).last_hidden_state
    return torch.gather(hidden, 1, batch.index[..., None].expand(-1, -1, hidden.shape[-1]))


def policy_loss(logp, batch: TokenBatch, *, loss: str = "grpo", clip_low: float = 0.2,
                clip_high: float = 0.2, is_cap: float = 1.0, cispo_cap: float = 5.0,
                m2_threshold: float = 0.04, max_new_tokens: int = 1,
                terms: BatchTerms | None = None):
    """Per-sequence losses (n,) of the chosen loss (see the module docstring and
    ``objectives``); their mean over a batch is the batch's loss.

    Args: logp (n, L) current log-probs of the completion tokens; batch: its rollouts;
    terms: the batch-level ``objectives.BatchTerms`` of these rows (m2po's mask, the
    token-aggregation denominator) when the rows are part of a larger batch; None computes
    them from these rows alone (from ``logp``'s detached values for m2po).
    """
    mask = batch.mask
    adv = batch.adv[:, None]
    if loss == "asymre":
        return -(adv * logp * mask.float()).sum(-1) / max_new_tokens
    log_ratio = (logp - batch.old_logp) * mask.float()
    params = LossParams(clip_low, clip_high, is_cap, cispo_cap, m2_threshold)
    tok = token_terms(loss, logp, log_ratio, adv, params).tok
    if terms is None:
        terms = batch_terms(loss, log_ratio.detach(), mask, params)
    return (tok * terms.keep.float()).sum(-1) / terms.denominator


def loss_params(loss_kwargs: dict) -> LossParams:
    """The ``objectives.LossParams`` in keyword arguments of ``policy_loss``."""
    return LossParams(**{f.name: loss_kwargs[f.name] for f in fields(LossParams)
                         if f.name in loss_kwargs})


@torch.no_grad()
def update_terms(logp, batch: TokenBatch, loss_kwargs: dict) -> BatchTerms | None:
    """The ``BatchTerms`` of a whole update batch (``logp`` (n, L) at the update's weights;
    None will do for a loss outside ``objectives.BATCH_MASKED``), or None for asymre (no
    ratio)."""
    loss = loss_kwargs.get("loss", "grpo")
    if loss not in RATIO_LOSSES:
        return None
    log_ratio = None if logp is None else (logp - batch.old_logp) * batch.mask.float()
    return batch_terms(loss, log_ratio, batch.mask, loss_params(loss_kwargs))


@torch.no_grad()
def loss_stats(logp, entropy, batch: TokenBatch, clip_low: float = 0.2,
               clip_high: float = 0.2, *, loss_kwargs: dict | None = None,
               terms: BatchTerms | None = None) -> dict:
    """Diagnostics over valid tokens (theory.md section 12.2): clip fraction (tokens with
    A != 0 whose ratio lies beyond the clip range on the side GRPO clips), normalised
    importance-weight ESS in (0, 1], approximate KL(behaviour || current) (k3 estimator,
    nats/token), mean entropy (nats); and, with ``loss_kwargs`` (the training loss) and the
    batch's ``terms``: max r; mean (log r)^2 over all valid tokens (``logr2``) and over those
    still carrying gradient after the loss's mask, clip or veto (``logr2_kept``, nats^2); the
    share of positive- / negative-advantage tokens the loss acted on (``acted_pos``,
    ``acted_neg``: clipped, truncated, masked or vetoed; None without such tokens)."""
    m = batch.mask
    log_ratio = (logp - batch.old_logp)[m].double()
    w = log_ratio.exp()
    adv = batch.adv[:, None].expand_as(batch.mask)[m]
    clipped = ((adv > 0) & (w > 1 + clip_high)) | ((adv < 0) & (w < 1 - clip_low))
    nonzero = adv != 0
    out = {
        "clip_fraction": float(clipped[nonzero].float().mean()) if nonzero.any() else 0.0,
        "is_ess": float(w.sum() ** 2 / (w.numel() * (w ** 2).sum())) if w.numel() else 1.0,
        "approx_kl": float(((w - 1) - log_ratio).mean()) if w.numel() else 0.0,
        "entropy": float(entropy[m].mean()) if m.any() else 0.0,
    }
    loss = (loss_kwargs or {}).get("loss")
    if loss in RATIO_LOSSES and w.numel():
        out.update(_staleness_stats(logp, batch, loss_kwargs, terms))
    return out


def _staleness_stats(logp, batch: TokenBatch, loss_kwargs: dict, terms) -> dict:
    """The loss-dependent part of ``loss_stats``."""
    m = batch.mask
    full = (logp - batch.old_logp) * m.float()
    if terms is None:
        terms = update_terms(logp, batch, loss_kwargs)
    acts = token_terms(loss_kwargs["loss"], logp, full, batch.adv[:, None].expand_as(m),
                       loss_params(loss_kwargs))
    masked = m & ~terms.keep  # m2po's mask
    acted, kept = (acts.acted | masked)[m], (m & terms.keep & ~acts.dropped)[m]
    adv = batch.adv[:, None].expand_as(m)[m]
    sq = full[m].double().pow(2)

    def share(side):
        return float(acted[side].float().mean()) if side.any() else None
    return {"ratio_max": float(full[m].double().exp().max()),
            "logr2": float(sq.mean()),
            "logr2_kept": float(sq[kept].mean()) if kept.any() else None,
            "acted_pos": share(adv > 0), "acted_neg": share(adv < 0)}
