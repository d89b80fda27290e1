"""The "tabular LLM" of the synchronous simulator: a softmax policy over K answers per prompt.

P prompts, K answers each. A rollout's reward is Bernoulli(q(p, k)): with
``reward_model="binary"`` q is 1 for ``n_correct`` answers and 0 otherwise (a verifiable
reward); with ``"bernoulli"`` q ~ Beta(a, b) per answer, so that answers of close quality
must be told apart from noisy outcomes, as when an answer stands for many completions that are
right only some of the time. The policy is pi_theta(k | p) = softmax(theta[p])_k; the loss is
F(theta) = mean_p (max_k q(p, k) - E_{pi(.|p)} q), the expected regret (theory.md section 4's
F >= 0, smooth).

Rollouts come in groups of G answers to one prompt (prompts drawn uniformly), sampled with the
current weights. As in the harness (section 6) the advantage and the behaviour
log-probability are computed once, at generation, and reused at every replay:
A = (r - mean_group r) / std_group r (0 when the group's rewards are all equal).
Per-sample gradient of the loss to minimise, with w = pi_theta(z) / pi_old(z):

* ``grpo``: -A w grad log pi(z), zeroed where PPO's clip (epsilon = 0.2) is active
  (A > 0 and w > 1 + eps, or A < 0 and w < 1 - eps);
* ``grpo_unclipped``: -A w grad log pi(z);
* ``grpo_truncated``: -A min(w, c) grad log pi(z), the weight held constant
  (c = ``truncation``);
* ``asymre``: -(r - (V_hat + dV)) grad log pi(z), V_hat the group mean, dV = -0.1, no ratio.

So staleness noise and bias come from the importance weights and the clipping, as in a real run.
The probes' reference gradient is the mean on-policy per-sample gradient over fresh groups
(``reference_groups`` per prompt), disjoint from the buffer, with its error estimated from the
spread of the group means.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .. import checks

# The LLM harness's names (llm_experiments.rl.choices.LOSSES) for the same objectives; repeated
# here because replaytheory must not import the harness.
LOSSES = ("grpo", "grpo_unclipped", "grpo_truncated", "asymre")


@dataclass(frozen=True)
class TabularProblem:
    """Parameters of the tabular policy problem (module docstring).

    Args:
        loss: one of ``LOSSES``. n_prompts: P >= 1. n_answers: K >= 2. group_size: G >= 2
            (R must be a multiple of G).
        reward_model: "bernoulli" (q ~ Beta(reward_beta)) or "binary" (``n_correct`` right
            answers per prompt, in [1, K - 1]). reward_beta: (a, b), both > 0.
        init_scale: standard deviation (>= 0) of the initial logits.
        clip: PPO clip epsilon in (0, 1). truncation: importance-weight cap c > 0.
        dv: AsymRE baseline shift (real; the paper's -0.1).
        reference_groups: fresh groups per prompt behind the probes' reference, >= 2.
        problem_seed: seed of the rewards and initial logits (the same for every run).
    """

    loss: str = "grpo"
    n_prompts: int = 64
    n_answers: int = 16
    group_size: int = 8
    reward_model: str = "bernoulli"
    reward_beta: tuple = (1.0, 3.0)
    n_correct: int = 1
    init_scale: float = 1.0
    clip: float = 0.2
    truncation: float = 1.0
    dv: float = -0.1
    reference_groups: int = 16
    problem_seed: int = 0

    name = "tabular"

    def __post_init__(self):
        checks.choice("loss", self.loss, LOSSES)
        checks.integer("n_prompts", self.n_prompts, 1)
        checks.integer("n_answers", self.n_answers, 2)
        checks.integer("group_size", self.group_size, 2)
        checks.choice("reward_model", self.reward_model, ("bernoulli", "binary"))
        if len(self.reward_beta) != 2:
            raise ValueError(f"reward_beta must be a pair (a, b), got {self.reward_beta!r}")
        checks.positive("reward_beta[0]", self.reward_beta[0])
        checks.positive("reward_beta[1]", self.reward_beta[1])
        checks.integer("n_correct", self.n_correct, 1, self.n_answers - 1)
        checks.nonnegative("init_scale", self.init_scale)
        checks.real("clip", self.clip, 0.0, 1.0, lo_open=True, hi_open=True)
        checks.positive("truncation", self.truncation)
        checks.real("dv", self.dv)
        checks.integer("reference_groups", self.reference_groups, 2)
        checks.integer("problem_seed", self.problem_seed, 0)

    def to_dict(self) -> dict:
        return {"problem": self.name, **asdict(self)}

    def rewards_and_init(self) -> tuple[np.ndarray, np.ndarray]:
        """The (P, K) success probabilities q and the initial logits (``problem_seed``)."""
        rng = np.random.default_rng(self.problem_seed)
        p, k = self.n_prompts, self.n_answers
        if self.reward_model == "bernoulli":
            q = rng.beta(*self.reward_beta, size=(p, k))
        else:
            q = np.zeros((p, k))
            for i in range(p):
                q[i, rng.choice(k, self.n_correct, replace=False)] = 1.0
        return q, self.init_scale * rng.standard_normal((p, k))

    def initial_loss(self) -> float:
        """F(theta_0)."""
        q, theta = self.rewards_and_init()
        return float(np.mean(q.max(-1) - np.sum(_softmax(theta) * q, axis=-1)))

    def smoothness_at_init(self, h: float = 1e-5) -> float:
        """L of F at theta_0: largest |eigenvalue| of its Hessian (finite differences).

        F is a sum of per-prompt terms, so the Hessian is block diagonal. The GRPO update
        divides by the group's reward std, so L of F is only a proxy for the finite-step
        design's smoothness constant.
        """
        q, theta = self.rewards_and_init()
        p, k = q.shape

        def grad(th):  # of F = mean_p (max q - pi . q)
            pi = _softmax(th)
            return -pi * (q - np.sum(pi * q, -1, keepdims=True)) / p

        eye = np.eye(k)
        hess = np.stack([(grad(theta + h * eye[j]) - grad(theta - h * eye[j])) / (2 * h)
                         for j in range(k)], axis=-1)  # (P, K, K)
        return float(np.max(np.abs(np.linalg.eigvalsh((hess + hess.transpose(0, 2, 1)) / 2))))

    def check_cell(self, buffer_size: int, batch_size: int, rollouts_per_step: int) -> None:
        if rollouts_per_step % self.group_size:
            raise ValueError(f"rollouts_per_step must be a multiple of group_size "
                             f"({self.group_size}), got {rollouts_per_step}")

    def start(self, caps, lrs, batch_size, rollouts_per_step, rng) -> "_TabState":
        return _TabState(self, np.asarray(caps), np.asarray(lrs, float), batch_size,
                         rollouts_per_step, rng)


def _log_softmax(theta: np.ndarray) -> np.ndarray:
    z = theta - theta.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _softmax(theta: np.ndarray) -> np.ndarray:
    return np.exp(_log_softmax(theta))


def _advantages(r: np.ndarray) -> np.ndarray:
    """Group-normalised advantage over the last axis; 0 where a group's rewards are equal."""
    centred = r - r.mean(axis=-1, keepdims=True)
    std = r.std(axis=-1, keepdims=True)
    return np.divide(centred, std, out=np.zeros_like(centred), where=std > 1e-12)


class _TabState:
    """S runs of the tabular problem advanced together (one (B, R), per-run N and lr)."""

    def __init__(self, prob: TabularProblem, caps, lrs, b, r, rng):
        self.p, self.caps, self.lr, self.b, self.r, self.rng = prob, caps, lrs, b, r, rng
        self.q, theta0 = prob.rewards_and_init()
        s, n = caps.size, int(caps.max())
        self.theta = np.tile(theta0, (s, 1, 1))
        self.logpi = _log_softmax(self.theta)
        self.pi = np.exp(self.logpi)
        self.fields = {"prompt": np.zeros((s, n), np.int64), "answer": np.zeros((s, n), np.int64),
                       "adv": np.zeros((s, n)), "reward": np.zeros((s, n)),
                       "vhat": np.zeros((s, n)), "logp_old": np.zeros((s, n))}
        self.h = int(np.ceil(caps.max() / r))
        self.hist: dict[int, np.ndarray] = {}  # theta history of probed runs, by run

    def track(self, run: int) -> None:
        """Keep the last H weights of ``run`` (for drift at probes)."""
        self.hist[run] = np.repeat(self.theta[run][None], self.h, axis=0)

    def _sample(self, pi_rows, shape):
        """Answers drawn from each row of probabilities; ``shape`` = leading sample shape."""
        cdf = np.cumsum(pi_rows, axis=-1)
        u = self.rng.random(shape)
        return np.minimum((u[..., None] > cdf[..., None, :]).sum(-1), self.p.n_answers - 1)

    def insert(self, t, slots):
        s, g = self.caps.size, self.p.group_size
        groups = self.r // g
        prompts = self.rng.integers(0, self.p.n_prompts, (s, groups))
        rows = np.arange(s)[:, None]
        pi_rows = self.pi[rows, prompts]  # (s, groups, K)
        answers = self._sample(pi_rows, (s, groups, g))
        reward = (self.rng.random(answers.shape)
                  < self.q[prompts[..., None], answers]).astype(float)
        vhat = np.broadcast_to(reward.mean(axis=-1, keepdims=True), reward.shape)
        logp = np.take_along_axis(self.logpi[rows, prompts], answers, axis=-1)
        f = self.fields
        flat = {"prompt": np.repeat(prompts, g, axis=1), "answer": answers.reshape(s, -1),
                "adv": _advantages(reward).reshape(s, -1), "reward": reward.reshape(s, -1),
                "vhat": vhat.reshape(s, -1), "logp_old": logp.reshape(s, -1)}
        for key, val in flat.items():
            f[key][rows, slots] = val

    def _coef(self, rows, slots):
        """Per-sample coefficient c (gradient of the loss = -c (e_z - pi)) at the current pi."""
        f, p = self.fields, self.p
        prompt, answer = f["prompt"][rows, slots], f["answer"][rows, slots]
        if p.loss == "asymre":
            return f["reward"][rows, slots] - (f["vhat"][rows, slots] + p.dv), prompt, answer
        with np.errstate(over="ignore"):  # an unclipped weight may blow up: that run diverges
            w = np.exp(self.logpi[rows, prompt, answer] - f["logp_old"][rows, slots])
        adv = f["adv"][rows, slots]
        if p.loss == "grpo_unclipped":
            return adv * w, prompt, answer
        if p.loss == "grpo_truncated":
            return adv * np.minimum(w, p.truncation), prompt, answer
        clipped = ((adv > 0) & (w > 1 + p.clip)) | ((adv < 0) & (w < 1 - p.clip))
        return np.where(clipped, 0.0, adv * w), prompt, answer

    def update(self, t, drawn, stal):
        s, (pp, k) = self.caps.size, self.q.shape
        rows = np.arange(s)[:, None]
        c, prompt, answer = self._coef(rows, drawn)
        run_prompt = rows * pp + prompt
        ascent = np.bincount((run_prompt * k + answer).ravel(), weights=c.ravel(),
                             minlength=s * pp * k).reshape(s, pp, k)
        ascent -= np.bincount(run_prompt.ravel(), weights=c.ravel(),
                              minlength=s * pp).reshape(s, pp)[..., None] * self.pi
        self.theta += (self.lr / self.b)[:, None, None] * ascent
        self.logpi = _log_softmax(self.theta)
        self.pi = np.exp(self.logpi)
        for run, ring in self.hist.items():
            ring[(t + 1) % self.h] = self.theta[run]

    def loss(self, t) -> np.ndarray:
        return np.mean(self.q.max(-1) - np.sum(self.pi * self.q, axis=-1), axis=-1)

    def probe(self, t, run, ins_step, drawn):
        """Per-slot gradient noise of run ``run`` at step t against a fresh-sample reference."""
        p, cap = self.p, int(self.caps[run])
        (pp, k), g = self.q.shape, p.group_size
        filled = int(min((t + 1) * self.r, cap))
        slots = np.arange(filled)
        stal = t - ins_step[:filled]
        pi = self.pi[run]
        c, prompt, answer = self._coef(np.full(filled, run), slots)
        grads = np.zeros((filled, pp, k))
        grads[slots, prompt] = c[:, None] * pi[prompt]
        grads[slots, prompt, answer] -= c
        # Reference: fresh on-policy groups per prompt (w = 1, so clip and truncation are
        # inactive unless c < 1), per-sample gradient rows averaged within each prompt.
        m = p.reference_groups
        answers = self._sample(np.repeat(pi[:, None], m, axis=1), (pp, m, g))
        prob = np.take_along_axis(np.broadcast_to(self.q[:, None, None, :], (pp, m, g, k)),
                                  answers[..., None], axis=-1)[..., 0]
        reward = (self.rng.random(prob.shape) < prob).astype(float)
        if p.loss == "asymre":
            coef = reward - (reward.mean(axis=-1, keepdims=True) + p.dv)
        else:
            cap = min(1.0, p.truncation) if p.loss == "grpo_truncated" else 1.0
            coef = _advantages(reward) * cap
        rows = -coef[..., None] * (np.eye(k)[answers] - pi[:, None, None, :])
        group_means = rows.mean(axis=2)  # (P, m, K)
        g_ref = group_means.mean(axis=1) / pp  # row p of E[G] is E[G | p] / P
        ref_err = float(group_means.var(axis=1, ddof=1).sum() / m) / pp**2
        noise = grads.reshape(filled, -1) - g_ref.ravel()
        ring = self.hist[run]
        past = ring[(t - stal) % self.h]
        drift = np.linalg.norm((past - self.theta[run]).reshape(filled, -1), axis=1)
        out = {"noise": noise, "staleness": stal, "drift": drift, "g_ref": g_ref.ravel(),
               "ref_sq_error": ref_err}
        if p.loss in ("grpo", "grpo_truncated"):
            out.update(self._contribution(run, slots, c))
        return out

    def _contribution(self, run, slots, coef):
        """What the clip (or the truncation) keeps of each slot's gradient (section 10.7).

        A sample's gradient is -coef (e_z - pi), so <G_clip, G_unclip> / ||G_unclip||^2 is
        coef / (A w): 0 or 1 under the clip, min(w, c) / w under truncation. Samples with a
        zero advantage have no gradient to keep and are flagged out (``signal``).
        """
        f, p = self.fields, self.p
        prompt, answer = f["prompt"][run, slots], f["answer"][run, slots]
        with np.errstate(over="ignore"):
            w = np.exp(self.logpi[run, prompt, answer] - f["logp_old"][run, slots])
        unclipped = f["adv"][run, slots] * w
        signal = (unclipped != 0) & np.isfinite(unclipped)
        kept = np.divide(coef, unclipped, out=np.ones_like(coef), where=signal)
        cut = (kept == 0) if p.loss == "grpo" else (w > p.truncation)
        return {"kept": kept, "clip_fraction": (cut & signal).astype(float),
                "is_weight": w, "signal": signal}


__all__ = ["TabularProblem", "LOSSES"]
