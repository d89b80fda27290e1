"""Projections of flat gradient vectors for the probes: exact (the identity) or a seeded count
sketch to k dimensions whose inner products are unbiased (theory.md section 8.1.1).

A gradient is handed over as its parameter blocks (one tensor per trainable parameter, in
``model.parameters()`` order, each with a leading row dimension), so the full-length flat vector
never has to exist. The count sketch sends coordinate i of the flat vector (its index over all
blocks) to bucket h(i) in [0, k) with sign s(i) in {-1, +1}, both read from one 4-wise
independent hash v(i), a degree-3 polynomial modulo the prime p = 2^31 - 1 with coefficients
drawn from the seed: h = v mod k, s = +1 or -1 by the parity of v div k, and
(S x)_j = sum_{i: h(i) = j} s(i) x_i. Nothing of size k x P is ever formed: the hashes are
computed in passes of ``coords_per_pass`` coordinates, so a projection costs O(P) time and
O(k + coords_per_pass) memory besides its input. The hashes of the first ``cache_coords``
coordinates are kept (12 bytes each) because on a CPU computing them costs more than applying
them. Because S is linear, a fixed seed makes sketches of different probes, weights and rows
comparable (S a - S b = S (a - b)). The hashes are integer arithmetic, the same on every device;
the bucket sums are float32 (``index_add_``, whose order of addition is not fixed on CUDA).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from replaytheory import checks

PRIME = 2**31 - 1  # hash modulus: a coefficient times an index < 2^62 fits in int64


class Exact:
    """The identity projection: rows are the concatenated blocks (float32, length P)."""

    dim = 0

    @staticmethod
    def rows(blocks: Sequence[torch.Tensor]) -> torch.Tensor:
        """(n, P) float32: blocks of shape (n, ...) flattened and concatenated."""
        n = blocks[0].shape[0]
        return torch.cat([b.reshape(n, -1).float() for b in blocks], 1)

    def vector(self, x: torch.Tensor) -> torch.Tensor:
        """A flat vector (length P) as float32."""
        return self.rows([x[None]])[0]


@dataclass(frozen=True)
class CountSketch:
    """A count sketch R^P -> R^k with E[<S a, S b>] = <a, b> over the seed (theory.md section
    8.1.1). dim: k >= 1 buckets; seed: any integer >= 0 (same seed, same S on every device);
    coords_per_pass >= 1: coordinates hashed at once (memory ~ 24 bytes each);
    cache_coords >= 0: coordinates whose hashes are kept (12 bytes each)."""

    dim: int
    seed: int
    coords_per_pass: int = 1 << 22
    cache_coords: int = 1 << 25
    _coef: tuple = field(init=False, repr=False, compare=False)
    _cache: dict = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self):
        checks.integer("probe.sketch_dim", self.dim, 1, PRIME - 1)
        checks.integer("sketch seed", self.seed, 0, None)
        checks.integer("sketch coords_per_pass", self.coords_per_pass, 1, None)
        checks.integer("sketch cache_coords", self.cache_coords, 0, None)
        coef = np.random.default_rng(self.seed).integers(0, PRIME, 4).tolist()
        object.__setattr__(self, "_coef", tuple(coef))

    def _hash(self, lo: int, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Buckets (int64) and signs (float32) of flat coordinates lo .. lo + n - 1."""
        key = (lo, n, str(device))
        if key in self._cache:
            return self._cache[key]
        if lo + n >= PRIME:
            raise ValueError(f"a count sketch covers fewer than {PRIME} coordinates, got "
                             f"{lo + n}")
        x = torch.arange(lo, lo + n, dtype=torch.int64, device=device)
        v = torch.full_like(x, self._coef[0])
        for c in self._coef[1:]:  # Horner's rule mod p; every product stays below 2^62
            v = (v * x + c) % PRIME
        out = (v % self.dim, 1.0 - 2.0 * ((v // self.dim) & 1).float())
        if lo + n <= self.cache_coords:
            self._cache[key] = out
        return out

    def rows(self, blocks: Sequence[torch.Tensor]) -> torch.Tensor:
        """(n, k) float32 sketches of n flat vectors given as parameter blocks of shape
        (n, ...): block b covers the flat coordinates after those of blocks 0 .. b-1."""
        n = blocks[0].shape[0]
        out = torch.zeros(n, self.dim, dtype=torch.float32, device=blocks[0].device)
        offset = 0
        for block in blocks:
            flat = block.reshape(n, -1)
            for start in range(0, flat.shape[1], self.coords_per_pass):
                part = flat[:, start:start + self.coords_per_pass].float()
                bucket, sign = self._hash(offset + start, part.shape[1], part.device)
                out.index_add_(1, bucket, part * sign)
            offset += flat.shape[1]
        return out

    def vector(self, x: torch.Tensor) -> torch.Tensor:
        """(k,) float32 sketch of one flat vector x (length P, e.g. ``gradients.flat_grad``)."""
        return self.rows([x[None]])[0]


def projection(dim: int, seed: int) -> Exact | CountSketch:
    """The probes' projection: exact for ``dim`` = 0 (``probe.sketch_dim``'s default), else a
    ``CountSketch`` to ``dim`` >= 1 dimensions seeded with ``seed`` (>= 0)."""
    return Exact() if dim == 0 else CountSketch(dim, seed)
