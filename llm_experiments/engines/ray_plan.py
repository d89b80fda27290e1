"""What the Ray engine fixes before it starts, as plain arithmetic (no ``ray`` import, so the
config checks can use it): the rollouts per sampler call, the smallest LIFO queue that cannot
deadlock, and the exact resource shares of the actors, packed so that whole bundles fit
each node's CPUs and each GPU.

Ray keeps resource amounts as fixed-point numbers with ``RESOLUTION`` (1e-4) steps and accepts
amounts above 1 only as whole numbers; a placement group whose bundles ask for more than the
cluster holds never becomes ready. So shares are counted in whole units of ``RESOLUTION`` and
never rounded up.
"""

from __future__ import annotations

from math import floor, gcd

# Ray's resource resolution: amounts are fixed-point multiples of this.
RESOLUTION = 1e-4
_UNITS = 10_000  # 1 / RESOLUTION, exact


def chunk_groups(batch_size: int, workers: int, group_size: int) -> int:
    """Prompt groups per sampler call: the simulator's chunk of B / W rollouts in whole groups
    of G, at least one (``round`` as Python rounds, half to even). batch_size B, workers W,
    group_size G: integers >= 1."""
    return max(1, round(batch_size / (workers * group_size)))


def lifo_min_capacity(batch_size: int, chunk: int) -> int:
    """The smallest LIFO queue capacity C (rollouts) with which the Ray engine cannot deadlock.

    A sampler starts a chunk of ``chunk`` = n rollouts only if the rollouts held plus those in
    flight plus n fit in C (nothing is made only to be evicted); a trainer step takes
    ``batch_size`` = B once the queue holds B. Every count the queue reaches is a multiple of
    g = gcd(n, B) (it starts empty, gains n and loses B). Every sampler waits, with none in
    flight, exactly when the held count h has h + n > C; the run is stuck if then h < B. The
    largest multiple of g below B is B - g, and the driver can reach it (chunks landing before
    each step, as the residues k n mod B run over every multiple of g), so the run cannot
    stick iff C - n >= B - g, i.e. C >= B + n - gcd(n, B). (The shards of T trainers change
    nothing: round robin keeps them within one rollout, so every shard holds B / T iff the
    queue holds B.) Example: B = 20, n = 8 (G = 4, W = 2): C >= 24; with C = 20 the queue
    stops at 16.
    """
    return batch_size + chunk - gcd(chunk, batch_size)


def shares(total: float, parts: int, cap: float) -> list[float]:
    """Split ``total`` units of one resource (the cluster's CPUs or GPUs, >= 0) among ``parts``
    actors (>= 1), each asking at most ``cap`` (> 0): the fair share min(cap, total / parts),
    made exact for Ray, never rounded up. A fair share >= 1 becomes its whole part (Ray refuses
    fractions above 1). Below 1 the shares are multiples of ``RESOLUTION``: ``cap`` rounded
    down when it binds, else the total's units split as evenly as they go (the first actors get
    one unit more), which sum to exactly the total. Either way the shares sum to at most
    ``total``; all are 0 if the total is below one unit per actor."""
    fair = min(float(cap), float(total) / parts)
    if fair >= 1:
        return [float(floor(fair))] * parts
    if cap * parts <= total:
        return [_units(cap) / _UNITS] * parts
    each, extra = divmod(_units(total), parts)
    return [(each + (k < extra)) / _UNITS for k in range(parts)]


def packed_shares(bins: list[float], parts: int, cap: float) -> list[float]:
    """Split a resource held in ``bins`` (>= 0 each: the places one bundle must fit in whole,
    a node's CPUs per node, 1.0 per GPU) among ``parts`` actors (>= 1), each asking at most
    ``cap`` (> 0), so that the bundles can be placed. One bin: ``shares`` (the exact split).
    Several: one share for every actor, the largest s <= cap that Ray accepts (whole above
    1, whole units of ``RESOLUTION`` below) for which sum_j floor(bin_j / s) >= parts, so
    whole bundles fill the bins (2 GPUs and 3 actors: 0.5 each, where 2/3 each fits one
    actor per GPU and the third never). All 0 if no share of one unit fits."""
    if len(bins) == 1:
        return shares(bins[0], parts, cap)
    held = [_units(b) for b in bins]

    def accepted(units: int) -> int:  # Ray takes amounts above 1 only whole
        return units - units % _UNITS if units > _UNITS else units
    candidates = {accepted(min(_units(cap), h // k)) for h in held
                  for k in range(1, parts + 1)} | {accepted(_units(cap))}
    fitting = [u for u in candidates if u > 0 and sum(h // u for h in held) >= parts]
    return [max(fitting, default=0) / _UNITS] * parts


def _units(amount: float) -> int:
    """``amount`` in whole units of ``RESOLUTION``, rounded down (a float such as 0.3 that
    stands for 3000 units counts as 3000)."""
    return floor(amount * _UNITS + 1e-6)
