"""Samplers: one interface, exact behaviour log-probabilities.

A sampler turns prompts (token ids) into completions and returns, for every sampled token, the
log-probability of that token under exactly the distribution it was drawn from (temperature and
nucleus truncation included; no other logits processor). The trainer scores the full softmax
at the temperature, so ``sampler.top_p`` < 1 is accepted only for losses without an importance
ratio (``config.check_resolved``). It holds its own copy of the weights,
refreshed by ``WeightUpdate`` messages, so that it could live in another process.

This module holds the interface and the choice lists and imports nothing of ours, so that the
backends (``hf``, ``vllm``) and config.py import it without a circle; ``make.make_sampler``
builds the backend a configuration names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


# The sampler backends (``sampler.backend``): torch with a KV cache, or a vLLM engine.
BACKENDS = ("hf", "vllm")
# Float type of the HF sampler's inverse-CDF sum over the vocabulary (``sampler.cdf_dtype``):
# "auto" = float64 on CPU (the bitwise reference), "blocked" on other devices.
CDF_DTYPES = ("auto", "float64", "float32", "blocked")
# Static-shape decode steps kept across calls, CUDA graphs on a GPU (``sampler.decode_graphs``,
# ``samplers.graphs``): "auto" = on on a GPU, off elsewhere.
DECODE_GRAPHS = ("auto", "on", "off")
# The HF sampler's linear kernel (``sampler.linear_kernel``, ``policy.kernels.set_sampler_kernel``):
# "auto" = the run's (``run.fast_kernels``) where oneDNN decodes faster, torch's default elsewhere.
LINEAR_KERNELS = ("auto", "onednn", "default")


@dataclass
class WeightUpdate:
    """Message trainer -> sampler: the policy version (trainer step) and its weights."""

    version: int
    state: dict = field(repr=False)


@dataclass
class Generation:
    """Message sampler -> buffer: a batch of completions.

    tokens: (n, L) int32 completion ids, padded after the end; logprobs: (n, L) float32
    behaviour log-probs of those tokens (0 on padding); lengths: (n,) valid tokens, the first
    end-of-sequence included; finished: (n,) whether an end-of-sequence was produced.
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    lengths: np.ndarray
    finished: np.ndarray

    def completion(self, i: int) -> np.ndarray:
        """Valid completion ids of row ``i`` (end-of-sequence included if produced)."""
        return self.tokens[i, :self.lengths[i]]


class Sampler(Protocol):
    """What the run needs of a sampler (see the module docstring)."""
    version: int

    def load_weights(self, update: WeightUpdate) -> None:
        """Replace the sampler's weights by ``update.state`` (in place)."""

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float,
                 top_p: float = 1.0, seed: int = 0, uniforms=None) -> Generation:
        """Sample one completion per prompt. ``temperature`` 0 means greedy.

        seed: randomness of this call (reproducible). uniforms: optional (n, max_new_tokens)
        array in [0, 1) used by inverse-CDF sampling instead of fresh draws (common random
        numbers across weight versions; HF sampler only).
        """
