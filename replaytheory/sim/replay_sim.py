"""Synchronous replay process of theory.md section 4, simulated on problems with a known truth.

Each step t of each run: (1) generate R rollouts with the current weights and insert them in
a FIFO of capacity N (``buffer.sync_fifo_slots``); (2) draw B slots uniformly with replacement;
(3) theta <- theta - eta * mean of the B per-sample gradients. Cost per step in sample units:
B + mu R (section 4), so a compute budget C buys C / (B + mu R) steps.

Problems: ``QuadraticProblem`` (assumptions A1-A3 hold by construction, sigma, rho, kappa set
directly) and ``TabularProblem`` (softmax policy over K answers trained by group-normalised
policy gradient with the harness's loss variants). Runs that share (B, R) are advanced
together as arrays: every cell (N) x learning rate x seed of such a group is one row.

Probes: in one run per cell (the ``probe_lr``-th learning rate, first seed) the simulator
measures, every ``probe_every`` steps once the buffer is full, the four ``ProbeSet`` tables
(``probe_measure``), the noise table's ``uses`` column, the ``reuse`` table (each rollout's
noise against its own noise ``REUSE_GAPS`` probes earlier) and, for a loss with a clip or a
truncated weight, the ``contribution`` table; every ``minibatch_every`` steps it measures the
minibatch table only. None of these draws random numbers, so the runs do not change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .. import checks
from ..buffer import sync_fifo_slots
from ..fit.probe_measure import concat_rows, measure_contribution, measure_probe, measure_reuse
from ..fit.probes import ProbeSet
from .sim_quadratic import QuadraticProblem
from .sim_tabular import TabularProblem

PROBLEMS = (QuadraticProblem, TabularProblem)
# Gaps of the reuse probes, in probe intervals: a full probe pairs each buffer rollout with
# its own noise 1, 2, 4 and 8 probes earlier (theory.md section 10.7).
REUSE_GAPS = (1, 2, 4, 8)


@dataclass(frozen=True)
class ReplayResult:
    """Loss curves and probes of ``simulate_replay``.

    Attributes:
        problem: the problem's parameters (``to_dict``).
        cells: (n, 3) int array of (N, B, R). lrs: the step sizes. seeds: runs per (cell, lr).
        steps: (n,) steps simulated per cell.
        record_steps: steps after which the loss was recorded (0 = initial weights).
        loss: (n, n_lr, seeds, n_rec) F(theta) per run (NaN past a cell's steps or where a
            run diverged). loss_expected: the quadratic's E[F | draws] (same shape) or None.
        probes: ``ProbeSet`` with the extra columns ``run`` (probed-run id) and ``cell``.
        seconds: wall time of the simulation.
    """

    problem: dict
    cells: np.ndarray
    lrs: np.ndarray
    seeds: int
    steps: np.ndarray
    record_steps: np.ndarray
    loss: np.ndarray = field(repr=False)
    loss_expected: np.ndarray | None = field(repr=False)
    probes: ProbeSet = field(repr=False)
    seconds: float = 0.0

    @property
    def horizon(self) -> np.ndarray:
        """x = N / R per cell (steps)."""
        return self.cells[:, 0] / self.cells[:, 2]

    @property
    def replay_ratio(self) -> np.ndarray:
        """y = B / R per cell."""
        return self.cells[:, 1] / self.cells[:, 2]

    def cost_per_step(self, mu: float) -> np.ndarray:
        """B + mu R per cell, in samples (section 4)."""
        return self.cells[:, 1] + checks.positive("mu", mu) * self.cells[:, 2]

    def mean_loss(self, expected: bool | None = None) -> np.ndarray:
        """(n, n_lr, n_rec) loss averaged over seeds (the expected loss where available)."""
        use = self.loss_expected is not None if expected is None else expected
        if use and self.loss_expected is None:
            raise ValueError("expected=True needs a problem with an exact expected loss "
                             "(the quadratic)")
        data = self.loss_expected if use else self.loss
        return data.mean(axis=2)

    def loss_at_budget(self, mu: float, budget: float, expected: bool | None = None):
        """(n, n_lr) seed-mean loss after budget / (B + mu R) steps (log-linear interpolation).

        NaN where a cell was not simulated that far. ``budget`` in samples, > 0.
        """
        budget = checks.positive("budget", budget)
        at = budget / self.cost_per_step(mu)
        return interpolate_curves(self.record_steps, self.mean_loss(expected), at)


def interpolate_curves(x: np.ndarray, curves: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Values of ``curves`` (cells, lrs, points over ``x``) at x = ``at`` per cell.

    Linear in log value between recorded points; NaN outside the recorded range.
    """
    out = np.full(curves.shape[:2], np.nan)
    for i, target in enumerate(np.asarray(at, dtype=float)):
        j = int(np.searchsorted(x, target))
        if j >= x.size:
            continue
        if x[j] == target or j == 0:
            out[i] = curves[i, :, j]
            continue
        frac = (target - x[j - 1]) / (x[j] - x[j - 1])
        with np.errstate(divide="ignore", invalid="ignore"):
            lo, hi = np.log(curves[i, :, j - 1]), np.log(curves[i, :, j])
            out[i] = np.exp(lo + frac * (hi - lo))
    return out


def _check_cells(problem, cells) -> np.ndarray:
    arr = np.asarray(cells)
    if arr.ndim != 2 or arr.shape[1] != 3 or arr.shape[0] < 1:
        raise ValueError(f"cells must be a list of (N, B, R) triples, got shape {arr.shape}")
    out = np.empty(arr.shape, dtype=np.int64)
    for i, (n, b, r) in enumerate(arr):
        b = checks.integer(f"cells[{i}] batch_size B", b, 1)
        n = checks.integer(f"cells[{i}] buffer_size N", n, 1)
        r = checks.integer(f"cells[{i}] rollouts_per_step R", r, 1)
        if n < b:
            raise ValueError(f"cells[{i}] buffer_size N must be >= batch_size B ({b}): a "
                             f"batch is drawn from the buffer; got N = {n}")
        if r > n:
            raise ValueError(f"cells[{i}] rollouts_per_step R must be in [1, N = {n}] (the "
                             f"buffer holds at least one step's rollouts); got R = {r}")
        problem.check_cell(n, b, r)
        out[i] = (n, b, r)
    return out


def simulate_replay(problem, cells, *, steps, lrs, seeds: int = 1,
                    record_every: int | None = None, probe_every: int = 0,
                    minibatch_every: int = 0, probe_lr: int = 0, probe_start: int | None = None,
                    seed: int = 0) -> ReplayResult:
    """Run the synchronous process of section 4 for every (cell, lr, seed), vectorised.

    Args:
        problem: ``QuadraticProblem`` or ``TabularProblem``.
        cells: sequence of (N, B, R) integer triples with 1 <= R <= N and B <= N.
        steps: updates per cell, integer >= 1, or one per cell.
        lrs: step sizes eta > 0 (each cell runs every one).
        seeds: independent runs per (cell, lr), integer >= 1.
        record_every: steps between loss records (default: about 200 records).
        probe_every: steps between full probes (0 = none), taken once the buffer is full.
        minibatch_every: steps between minibatch-only probes (0 = none).
        probe_lr: index into ``lrs`` of the probed run of each cell.
        probe_start: first probe step (default: the step the cell's buffer fills).
        seed: seed of the random streams.

    Returns:
        ``ReplayResult``. Loss of the quadratic: ||theta||^2 / 2; of the tabular problem:
        mean_p (max_k q - E_pi q), the expected regret.
    """
    args = _check_replay_args(problem, cells, steps=steps, lrs=lrs, seeds=seeds,
                              record_every=record_every, probe_every=probe_every,
                              minibatch_every=minibatch_every, probe_lr=probe_lr,
                              probe_start=probe_start, seed=seed)
    shape = (args.cells.shape[0], args.lrs.size, args.seeds, args.record.size)
    out = _Outputs(loss=np.full(shape, np.nan),
                   loss_expected=np.full(shape, np.nan)
                   if isinstance(problem, QuadraticProblem) else None)
    t0 = time.perf_counter()
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (_, b, r) in enumerate(args.cells):
        groups.setdefault((int(b), int(r)), []).append(i)
    for g_idx, ((b, r), members) in enumerate(groups.items()):
        _run_group(problem, args, _group_runs(args, g_idx, b, r, members), out)
    probes = ProbeSet(concat_rows(out.parts, out.extra) if out.parts else {}, _run_counts(args))
    return ReplayResult(problem=problem.to_dict(), cells=args.cells, lrs=args.lrs,
                        seeds=args.seeds, steps=args.steps,
                        record_steps=args.record.astype(float), loss=out.loss,
                        loss_expected=out.loss_expected, probes=probes,
                        seconds=time.perf_counter() - t0)


@dataclass(frozen=True)
class _ReplayArgs:
    """``simulate_replay``'s validated arguments (meanings and ranges as there).

    Attributes:
        cells: (n, 3) int64 (N, B, R). steps: (n,) int64 updates per cell, >= 1.
        lrs: step sizes > 0. seeds: runs per (cell, lr), >= 1.
        record: sorted int steps after which the loss is recorded (0 and every cell's last).
        probe_every, minibatch_every: steps between probes, >= 0 (0 = none).
        probe_lr: index into ``lrs``. probe_start: first probe step >= 0 or None. seed: >= 0.
    """

    cells: np.ndarray
    steps: np.ndarray
    lrs: np.ndarray
    seeds: int
    record: np.ndarray
    probe_every: int
    minibatch_every: int
    probe_lr: int
    probe_start: int | None
    seed: int


@dataclass(frozen=True)
class _GroupRuns:
    """The runs of one (B, R) group, advanced together, one array row per run.

    Attributes:
        index: the group's position (seeds its random stream, offsets its run ids).
        batch: B. rollouts: R. members: indices of the group's cells.
        run_cell, run_lr, run_seed: (s,) cell, learning-rate index and seed of each run.
        caps: (s,) buffer capacity N of each run. probed: the runs that are probed.
        full_at: (s,) first step at which each run's buffer is full (ceil(N / R) - 1).
    """

    index: int
    batch: int
    rollouts: int
    members: list[int]
    run_cell: np.ndarray
    run_lr: np.ndarray
    run_seed: np.ndarray
    caps: np.ndarray
    probed: np.ndarray
    full_at: np.ndarray


@dataclass(frozen=True)
class _Buffer:
    """Per-slot bookkeeping of one group's FIFOs (theory.md section 4.1); arrays are updated
    in place.

    Attributes:
        ins: (s, max N) insertion step of each slot's rollout, -1 while empty.
        uses: (s, max N) training uses of each slot's rollout so far (only with full probes).
        history: per probed run, its last ``max(REUSE_GAPS)`` full probes (``_reuse_tables``).
    """

    ins: np.ndarray
    uses: np.ndarray | None
    history: dict[int, list]


@dataclass(frozen=True)
class _Outputs:
    """What the groups fill: loss curves (``ReplayResult`` shapes) and probe rows with their
    ``run``/``cell`` columns (``concat_rows`` arguments)."""

    loss: np.ndarray
    loss_expected: np.ndarray | None
    parts: list = field(default_factory=list)
    extra: list = field(default_factory=list)


def _check_replay_args(problem, cells, *, steps, lrs, seeds, record_every, probe_every,
                       minibatch_every, probe_lr, probe_start, seed) -> _ReplayArgs:
    """Validate ``simulate_replay``'s arguments; ValueError names the parameter and range."""
    if not isinstance(problem, PROBLEMS):
        raise ValueError(f"problem must be a QuadraticProblem or TabularProblem, got "
                         f"{type(problem).__name__}")
    cells = _check_cells(problem, cells)
    n_cells = cells.shape[0]
    step_arr = np.broadcast_to(np.asarray(steps), (n_cells,))
    step_arr = np.array([checks.integer("steps", s, 1) for s in step_arr], dtype=np.int64)
    lrs = checks.finite_array("lrs", lrs)
    if np.any(lrs <= 0):
        raise ValueError(f"lrs must be > 0 everywhere, got {lrs.min()!r}")
    seeds = checks.integer("seeds", seeds, 1)
    t_max = int(step_arr.max())
    every = max(1, t_max // 200) if record_every is None else checks.integer("record_every",
                                                                         record_every, 1)
    probe_every = checks.integer("probe_every", probe_every, 0)
    minibatch_every = checks.integer("minibatch_every", minibatch_every, 0)
    probe_lr = checks.integer("probe_lr", probe_lr, 0, lrs.size - 1)
    if probe_start is not None:
        probe_start = checks.integer("probe_start", probe_start, 0)
    seed = checks.integer("seed", seed, 0)
    record = np.unique(np.concatenate([np.arange(0, t_max + 1, every), step_arr]))
    return _ReplayArgs(cells=cells, steps=step_arr, lrs=lrs, seeds=seeds, record=record,
                       probe_every=probe_every, minibatch_every=minibatch_every,
                       probe_lr=probe_lr, probe_start=probe_start, seed=seed)


def _group_runs(args: _ReplayArgs, g_idx: int, b: int, r: int, members: list[int]) -> _GroupRuns:
    """Lay out the runs of group ``g_idx`` (cells ``members``, all with B = b, R = r): cell
    by cell, then learning rate, then seed; the probed run of a cell is its ``probe_lr``-th
    learning rate's first seed (none when no probe is asked for)."""
    n_lr, seeds = args.lrs.size, args.seeds
    run_cell = np.repeat(members, n_lr * seeds)
    run_lr = np.tile(np.repeat(np.arange(n_lr), seeds), len(members))
    run_seed = np.tile(np.arange(seeds), len(members) * n_lr)
    caps = args.cells[run_cell, 0]
    probed = np.flatnonzero((run_lr == args.probe_lr) & (run_seed == 0)) \
        if args.probe_every or args.minibatch_every else np.zeros(0, dtype=np.int64)
    return _GroupRuns(index=g_idx, batch=b, rollouts=r, members=members, run_cell=run_cell,
                      run_lr=run_lr, run_seed=run_seed, caps=caps, probed=probed,
                      full_at=-(-caps // r) - 1)


def _run_group(problem, args: _ReplayArgs, grp: _GroupRuns, out: _Outputs) -> None:
    """Advance every run of one group through the steps of theory.md section 4.1 (insert R
    rollouts, draw B slots uniformly with replacement, update), recording the loss and the
    probes into ``out``. The group's random stream is seeded with (seed, group index)."""
    b, r, caps = grp.batch, grp.rollouts, grp.caps
    s = caps.size
    rng = np.random.default_rng([args.seed, grp.index])
    state = problem.start(caps, args.lrs[grp.run_lr], b, r, rng)
    buf = _Buffer(ins=np.full((s, int(caps.max())), -1, dtype=np.int64),
                  uses=np.zeros((s, int(caps.max())), dtype=np.int64)
                  if args.probe_every else None,
                  history={int(run): [] for run in grp.probed})
    rows = np.arange(s)[:, None]
    for run in grp.probed:
        state.track(int(run))
    horizon_steps = int(args.steps[grp.members].max())
    k = 0
    for t in range(horizon_steps + 1):
        if k < args.record.size and args.record[k] == t:
            _record(out.loss, out.loss_expected, state, t, k, grp.run_cell, grp.run_lr,
                    grp.run_seed)
            k += 1
        if t == horizon_steps:
            break
        slots = sync_fifo_slots(t, r, caps)
        state.insert(t, slots)
        buf.ins[rows, slots] = t
        if buf.uses is not None:
            buf.uses[rows, slots] = 0
        filled = np.minimum((t + 1) * r, caps)
        drawn = (rng.random((s, b)) * filled[:, None]).astype(np.int64)
        stal = t - buf.ins[rows, drawn]
        _probe_runs(state, args, grp, buf, t, drawn, out)
        if buf.uses is not None:
            for run in grp.probed:
                np.add.at(buf.uses[run], drawn[run], 1)
        state.update(t, drawn, stal)
    # Cells that stop earlier than their group: forget records past their own steps.
    for i in grp.members:
        out.loss[i][..., args.record > args.steps[i]] = np.nan
        if out.loss_expected is not None:
            out.loss_expected[i][..., args.record > args.steps[i]] = np.nan


def _probe_runs(state, args: _ReplayArgs, grp: _GroupRuns, buf: _Buffer, t: int,
                drawn: np.ndarray, out: _Outputs) -> None:
    """At step t (before the update), probe every probed run whose buffer is full (or t >=
    ``probe_start``) and that has not reached its cell's steps: the four tables of theory.md
    section 8.1 plus ``uses``, ``reuse`` and ``contribution`` (section 10.7) at a full probe,
    the minibatch table alone at a minibatch probe. Draws no random numbers."""
    full = args.probe_every and t % args.probe_every == 0
    mini = args.minibatch_every and t % args.minibatch_every == 0
    if not (full or mini):
        return
    tables = ("noise", "coupling", "bias", "minibatch") if full else ("minibatch",)
    for run in grp.probed:
        start = grp.full_at[run] if args.probe_start is None else args.probe_start
        if t < start or t >= args.steps[grp.run_cell[run]]:
            continue
        vec = state.probe(t, int(run), buf.ins[run], drawn[run])
        part = measure_probe(
            vec["noise"], vec["staleness"], vec["drift"], vec["g_ref"],
            vec["ref_sq_error"], drawn[run], probe_step=t,
            buffer_size=int(grp.caps[run]), rollouts_per_step=grp.rollouts, tables=tables)
        if full:
            part["noise"]["uses"] = buf.uses[run][:len(vec["staleness"])].astype(float)
            part.update(_reuse_tables(vec, t, buf.ins[run], buf.uses[run],
                                      buf.history[int(run)], args.probe_every))
        out.parts.append(part)
        out.extra.append({"run": grp.index * 1_000_000 + int(run),
                          "cell": int(grp.run_cell[run])})


def _run_counts(args: _ReplayArgs) -> dict[str, float]:
    """The ``ProbeSet`` counts (section 2.1: unique rollouts, samples consumed) of a
    single-cell simulation; empty for several cells, whose runs differ in length."""
    if args.cells.shape[0] != 1:
        return {}
    _, b, r = args.cells[0]
    return {"unique_rollouts": float(args.steps[0] * r), "samples_consumed":
            float(args.steps[0] * b), "workers": 1.0, "trainers": 1.0,
            "steps": float(args.steps[0])}


def _reuse_tables(vec, t, ins_run, uses_run, history, probe_every):
    """The ``reuse`` and ``contribution`` tables of one full probe (section 10.7); appends
    this probe to the run's ``history`` (its last ``max(REUSE_GAPS)`` probes)."""
    noise = vec["noise"]
    filled = noise.shape[0]
    ins_now, uses_now = ins_run[:filled].copy(), uses_run[:filled].copy()
    out = {}
    reuse = [measure_reuse(noise, ins_now, then, ins_then, probe_step=t, gap=t - t_then,
                           uses=uses_now)
             for t_then, ins_then, then in history
             if (t - t_then) in {k * probe_every for k in REUSE_GAPS}]
    if reuse:
        out["reuse"] = concat_rows([{"reuse": rows} for rows in reuse])["reuse"]
    history.append((t, ins_now, noise))
    del history[:-max(REUSE_GAPS)]
    if "kept" in vec:
        sig = vec["signal"]
        out["contribution"] = measure_contribution(
            vec["kept"][sig], vec["clip_fraction"][sig], vec["is_weight"][sig],
            vec["staleness"][sig], uses_now[sig], probe_step=t)
    return out


def _record(loss, loss_exp, state, t, k, run_cell, run_lr, run_seed):
    val = state.loss(t)
    loss[run_cell, run_lr, run_seed, k] = np.where(np.isfinite(val), val, np.nan)
    if loss_exp is not None:
        val = state.expected_loss(t)
        loss_exp[run_cell, run_lr, run_seed, k] = np.where(np.isfinite(val), val, np.nan)


__all__ = ["ReplayResult", "simulate_replay", "interpolate_curves"]
