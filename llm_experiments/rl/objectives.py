"""The policy-gradient objectives with an importance ratio, one function per loss (theory.md
section 12): what each does to a token of a replayed rollout, and which tokens it acts on.

Notation: r = pi / pi_behaviour per token (pi the current policy, pi_behaviour the weights
that generated the rollout), A the rollout's advantage, sg() stop-gradient. The unclipped
importance-weighted loss -r A has the gradient -r A grad log pi; every other loss here alters
that gradient on some tokens ("acts" on them) and leaves it on the rest.

* ``grpo``: -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) (PPO's clip; acts where the clip
  zeroes the gradient).
* ``grpo_unclipped``: -r A (never acts).
* ``grpo_truncated`` (truncated IS, TIS): -sg(min(r, c)) A log pi, c = ``is_cap`` (acts where
  r > c: the weight is cut to c, the token keeps a gradient).
* ``cispo`` (MiniMax-M1, arXiv 2506.13585, section 3.1; TRL ``loss_type="cispo"``):
  -sg(min(r, eps_max)) A log pi, eps_max = ``cispo_cap`` (TRL recommends 5.0), no token's
  gradient ever dropped; aggregated over the batch's tokens like TRL's.
* ``m2po`` (Zheng et al., arXiv 2510.01161; AReaL ``actor.m2_threshold``): -r A with the
  second-moment mask of ``m2_keep``; the source's denominator (section "M2PO" of the paper,
  AReaL's docs/algorithms/m2po.md): the sum over the batch of every completion's length,
  sum_i |o_i|, masked tokens included. (AReaL's code divides by the tokens the mask keeps,
  larger by 1 / (1 - masked share); we follow the paper's formula.)
* ``neg_clip``, ``neg_cap``, ``neg_veto``: asymmetric. Positive-advantage tokens keep the
  unclipped -r A; negative-advantage tokens (where independent reports locate the collapses
  of stale training: TOPR arXiv 2503.14286, DPPO arXiv 2602.04879) keep a clip:
  ``neg_clip`` PPO's (acts where r < 1 - eps_low: the gradient is zeroed once a negative
  token's probability has fallen enough), ``neg_cap`` the weight sg(min(r, 1)) (acts where
  r > 1: a negative token whose probability rose since it was sampled is pushed down at
  most with weight 1), ``neg_veto`` a veto (acts outside [1 - eps_low, 1 + eps_high]: the
  token is dropped, like IcePop's band but on negatives only).

Decoupled PPO (Hilton et al. 2021; AReaL ``use_decoupled_loss``) is not a separate loss here:
its proximal policy is the policy one update old, and this trainer takes exactly one optimizer
step per batch, so the proximal policy is the current one at the update and the decoupled
clip never acts; its gradient is then -sg(pi_prox / pi_behaviour) A grad log pi, the
unclipped gradient (``grpo_unclipped``), and with AReaL's ``behav_imp_weight_cap`` a veto of
the tokens whose weight passes the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .choices import LOSSES

# Sequence: each rollout's token losses averaged over its own tokens (the harness's
# convention: the batch gradient is the mean of per-rollout gradients). Batch tokens: summed
# over the rollout's tokens and divided by the batch's mean completion length, so the batch
# mean is the sum over all tokens over their number (DAPO / TRL, M2PO, CISPO).
SEQUENCE, BATCH_TOKENS = "sequence", "batch_tokens"


@dataclass(frozen=True)
class LossParams:
    """The parameters of the objectives (each checked where ``config.TrainerConfig`` holds it).

    clip_low, clip_high: PPO clip range [1 - clip_low, 1 + clip_high], each in [0, 1].
    is_cap: TIS weight cap c (> 0). cispo_cap: CISPO's eps_max (> 0).
    m2_threshold: M2PO's bound on the batch mean of (log r)^2 over kept tokens (> 0, nats^2).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    is_cap: float = 1.0
    cispo_cap: float = 5.0
    m2_threshold: float = 0.04


@dataclass
class TokenTerms:
    """An objective on n rollouts x L tokens: tok (n, L) token losses (padding not yet
    masked); acted (n, L) bool: tokens whose gradient differs from the unclipped -r A's;
    dropped (n, L) bool: tokens left without any gradient (a subset of acted)."""

    tok: torch.Tensor
    acted: torch.Tensor
    dropped: torch.Tensor


def _none(x: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(x, dtype=torch.bool)


def _ppo(r, a, p: LossParams) -> TokenTerms:
    clipped = ((a > 0) & (r > 1 + p.clip_high)) | ((a < 0) & (r < 1 - p.clip_low))
    tok = -torch.minimum(r * a, r.clamp(1 - p.clip_low, 1 + p.clip_high) * a)
    return TokenTerms(tok, clipped, clipped)


def _unclipped(r, a, p: LossParams) -> TokenTerms:
    return TokenTerms(-r * a, _none(r), _none(r))


def _truncated(r, a, logp, cap: float) -> TokenTerms:
    over = (r > cap) & (a != 0)
    return TokenTerms(-r.clamp(max=cap).detach() * a * logp, over, _none(r))


def _negatives(a, pos: TokenTerms, neg: TokenTerms) -> TokenTerms:
    """Positive-advantage tokens from ``pos``, the others from ``neg``."""
    up = a > 0
    return TokenTerms(torch.where(up, pos.tok, neg.tok), torch.where(up, pos.acted, neg.acted),
                      torch.where(up, pos.dropped, neg.dropped))


def _neg_veto(r, a, p: LossParams) -> TokenTerms:
    out = (a < 0) & ((r < 1 - p.clip_low) | (r > 1 + p.clip_high))
    return TokenTerms(torch.where(out, torch.zeros_like(r), -r * a), out, out)


def _neg_cap(r, a, logp, p: LossParams) -> TokenTerms:
    over = (a < 0) & (r > 1)
    weight = torch.where(over, torch.ones_like(r), r).detach()
    # Below the cap the weight is r itself: the token keeps -r A's gradient exactly.
    tok = torch.where(over, -weight * a * logp, -r * a)
    return TokenTerms(tok, over, _none(r))


def token_terms(loss: str, logp: torch.Tensor, log_ratio: torch.Tensor, adv: torch.Tensor,
                params: LossParams) -> TokenTerms:
    """The ``TokenTerms`` of ``loss`` (one of ``choices.RATIO_LOSSES``, not m2po's mask: see
    ``m2_keep``) for log-probs ``logp`` (n, L), log r = ``log_ratio`` (n, L, zero on
    padding) and advantages ``adv`` broadcastable to (n, L)."""
    r = torch.exp(log_ratio)
    a = adv
    if loss == "grpo":
        return _ppo(r, a, params)
    if loss in ("grpo_unclipped", "m2po"):
        return _unclipped(r, a, params)
    if loss == "grpo_truncated":
        return _truncated(r, a, logp, params.is_cap)
    if loss == "cispo":
        return _truncated(r, a, logp, params.cispo_cap)
    if loss == "neg_clip":
        return _negatives(a, _unclipped(r, a, params), _ppo(r, a, params))
    if loss == "neg_cap":
        return _neg_cap(r, a, logp, params)
    if loss == "neg_veto":
        return _neg_veto(r, a, params)
    raise ValueError(f"trainer.loss must be one of {list(LOSSES)}, got {loss!r}")


AGGREGATION = {"cispo": BATCH_TOKENS, "m2po": BATCH_TOKENS}
# Losses whose per-token weights depend on the whole batch's log-ratios (not only its mask).
BATCH_MASKED = ("m2po",)


@torch.no_grad()
def m2_keep(log_ratio: torch.Tensor, eligible: torch.Tensor, threshold: float) -> torch.Tensor:
    """M2PO's second-moment mask (arXiv 2510.01161; AReaL ``m2_threshold``): of the
    ``eligible`` tokens (n, L) bool, drop those with the largest (log r)^2, fewest first,
    until the mean (log r)^2 of the tokens kept is below ``threshold`` (> 0, nats^2); at
    least one token is always kept. Returns the kept tokens (n, L) bool."""
    m2 = log_ratio.double().pow(2)[eligible]
    keep = torch.zeros_like(eligible)
    if m2.numel() == 0:
        return keep
    ranked, order = torch.sort(m2, descending=True, stable=True)
    n = ranked.numel()
    # Mean of the tokens left after dropping the k largest, for k = 0 .. n-1.
    left = ranked.sum() - torch.cat([ranked.new_zeros(1), ranked.cumsum(0)[:-1]])
    means = left / torch.arange(n, 0, -1, dtype=ranked.dtype, device=ranked.device)
    below = torch.nonzero(means < threshold)
    drop = int(below[0]) if below.numel() else n - 1
    kept = torch.ones(n, dtype=torch.bool, device=eligible.device)
    kept[order[:drop]] = False
    keep[eligible] = kept
    return keep


@dataclass
class BatchTerms:
    """What an objective needs of the whole update batch, per row so that it slices with the
    batch (micro-batches, per-sample gradients): keep (n, L) bool, the tokens that count
    (m2po's mask, else the completion mask); denominator (n,) float, what a row's summed
    token losses are divided by (its own length for ``SEQUENCE`` aggregation, the batch's
    mean length for ``BATCH_TOKENS``)."""

    keep: torch.Tensor
    denominator: torch.Tensor

    def rows(self, sl: slice) -> "BatchTerms":
        """The rows ``sl``."""
        return BatchTerms(self.keep[sl], self.denominator[sl])


def batch_terms(loss: str, log_ratio: torch.Tensor | None, mask: torch.Tensor,
                params: LossParams) -> BatchTerms:
    """The ``BatchTerms`` of ``loss`` over a whole batch: ``mask`` (n, L) its completion
    tokens; ``log_ratio`` (n, L) its log r at the update's weights (detached; needed only for
    the losses in ``BATCH_MASKED``, may be None otherwise)."""
    keep = mask
    if loss in BATCH_MASKED:
        if log_ratio is None:
            raise ValueError(f"trainer.loss={loss} needs the batch's log-ratios for its mask")
        keep = m2_keep(log_ratio, mask, params.m2_threshold)
    lengths = mask.float().sum(-1)
    if AGGREGATION.get(loss, SEQUENCE) == BATCH_TOKENS:
        return BatchTerms(keep, torch.full_like(lengths, float(lengths.mean().clamp(min=1.0))))
    return BatchTerms(keep, lengths.clamp(min=1))
