"""Decode steps of static shape, captured once as CUDA graphs and replayed (issue 28, item 3).

A decode step of a small model on a GPU is launch-bound: some 15 kernels per layer, each a
few microseconds of work, and the host issues them one by one (~24 ms a token at 24 layers on
an H200, about 3% of what its memory bandwidth allows). A CUDA graph issues a whole step in
one launch, but it replays fixed kernels on fixed memory, so the step must not change shape
or address from token to token or from call to call:

* the key/value cache (``direct.DecodeCache``) is kept across ``generate`` calls (the
  sampler's weights are updated in place, so graphs stay valid across weight versions). Its
  rows, prompt width and new-token columns only grow: a call uses the first rows and the
  first max_new new-token columns of it, so calls of other sizes (evaluation, pass@k,
  training, each probe) share one cache and its graphs. It is reallocated only for a call
  larger than every earlier one, the old cache freed first (two caches at once would double
  the peak, ~64 GB at 256 x 1,100 columns of a Qwen3-0.6B shape in bf16);
* a call of n prompts runs ``row_bucket(n)`` rows (the next power of two), the extra rows
  copies of the last prompt whose outputs are dropped, as finished rows' are: at most
  log2 of the largest call's row count + 1 row counts, so few graphs. A call's prompts are
  left-padded to their own width rounded up to ``WIDTH_BLOCK`` (not the widest call's:
  short prompts after a long one attend to no extra padding), its new tokens in the columns
  after it;
* a step writes its keys/values at a column held in a device tensor and attends to the
  first ``span`` columns, ``span`` the step's column rounded up to ``SPAN_BLOCK``, with
  columns not yet written masked out: one graph per (rows, span), not per token;
* compaction moves the kept rows to the front of the same buffers and keeps
  ceil(rows / 2^k) of them (padded with finished rows, whose outputs the sampler ignores),
  so at most log2(n) row counts occur.

A step is idempotent (it recomputes and rewrites the same column), so a graph is captured at
the step that first needs it, after one warm-up run on a side stream, and then replayed. Both
run under the cache's device (``run.device``, e.g. cuda:1) with streams made on it: torch
would otherwise capture on a stream of the current device (cuda:0), which fails or records an
empty graph whose replays leave the logits stale. On a CPU nothing is captured: the same
static-shape step runs eagerly (what the tests check against ``direct.StaticDecoder``).
"""

from __future__ import annotations

import torch

from ..policy.direct import DecodeCache, StaticDecoder, attention, run_layers

# Prompt widths are rounded up to a multiple of this (tokens), so that calls whose longest
# prompt differs a little share one cache and its graphs.
WIDTH_BLOCK = 64
# Attended columns are rounded up to a multiple of this: graphs per call ~ columns / 128,
# at most 127 masked columns of extra attention per step.
SPAN_BLOCK = 128


def _round_up(x: int, block: int) -> int:
    return -(-x // block) * block


def row_bucket(n: int) -> int:
    """Rows a call of ``n`` >= 1 prompts runs: the smallest power of two >= n."""
    return 1 << (n - 1).bit_length()


def kept_rows(alive: torch.Tensor, rows: int) -> torch.Tensor:
    """Indices (sorted) of the rows to keep when ``alive`` (rows,) bool marks the unfinished
    ones: all of them, padded with finished rows to the smallest ceil(rows / 2^k) (k >= 0)
    that holds them, so that successive compactions give at most log2(rows) + 1 counts."""
    live = int(alive.sum())
    target = rows
    while target > 1 and -(-target // 2) >= live:
        target = -(-target // 2)
    order = torch.argsort((~alive).to(torch.int8), stable=True)  # alive rows first
    return order[:target].sort().values


class GraphedDecoder:
    """``direct.StaticDecoder``'s interface (``prefill``, ``next_positions``, ``step``,
    ``keep``) with static-shape decode steps, captured as CUDA graphs when ``capture``.

    Kept by the sampler across calls: ``start`` readies it for a batch of prompts, reusing
    the cache and graphs when the call fits them (see the module docstring). The model's
    weights must be updated in place (``HFSampler.load_weights`` does).
    """

    def __init__(self, model, capture: bool):
        self.model, self.capture = model, bool(capture)
        self.shape = None  # (rows, width, max_new) the cache holds
        self.cache = self.prompts = None
        self.graphs: dict = {}

    def start(self, prompts, max_new: int, pad_id: int, device) -> "GraphedDecoder":
        """Ready a call on ``prompts`` (n >= 1 token-id lists) with ``max_new`` >= 1 new
        tokens on ``device``; returns self."""
        n, w = len(prompts), max(len(p) for p in prompts)
        rows, device = row_bucket(n), torch.device(device)
        old = self.shape if self.shape is not None and self.device == device else (0, 0, 0)
        need = (rows, _round_up(w, WIDTH_BLOCK), max_new)
        if any(a > b for a, b in zip(need, old)):
            self._allocate(*(max(a, b) for a, b in zip(need, old)), device)
        self.rows, self.width = n, need[1]
        padded = list(prompts) + [prompts[-1]] * (rows - n)
        view = DecodeCache(keys=[k[:rows] for k in self.cache.keys],
                           values=[v[:rows] for v in self.cache.values],
                           valid=self.cache.valid[:rows])
        # Every column after this call's prompts is one it may write (at most max_new used).
        self.prompts = StaticDecoder(self.model, padded, self.columns.numel() - self.width,
                                     pad_id, device, width=self.width, cache=view)
        return self

    def _allocate(self, n: int, width: int, max_new: int, device: torch.device) -> None:
        # Free the old cache, and the graphs and decoder that point into it, before the new
        # one exists: the peak is one cache, not two.
        self.graphs.clear()
        self.cache = self.prompts = None
        self.cache = DecodeCache.allocate(self.model, n, width + max_new, device,
                                          fill=torch.zeros)
        self.shape, self.device = (n, width, max_new), device
        self.columns = torch.arange(width + max_new, device=device)
        self.tok = torch.zeros((n, 1), dtype=torch.long, device=device)
        self.pos = torch.zeros((n, 1), dtype=torch.long, device=device)
        self.col = torch.zeros((1,), dtype=torch.long, device=device)
        # One memory pool for every graph of this cache: a graph's intermediates may share
        # memory with another's output, which is safe because graphs never run concurrently
        # and each output is read before the next replay (``step``'s contract).
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None

    def prefill(self):
        """Next-token logits (n, V) after each row's prompt (eager: once per call)."""
        return self.prompts.prefill()[:self.rows]

    def next_positions(self) -> torch.Tensor:
        """Position (n, 1) of the first new token of each row."""
        return self.prompts.next_positions()[:self.rows]

    def _static_step(self, rows: int, span: int) -> torch.Tensor:
        """Logits (rows, V) after the tokens in ``self.tok[:rows]`` at ``self.pos[:rows]``,
        written at column ``self.col``, attending to the first ``span`` columns."""
        c = self.cache
        mask = (c.valid[:rows, :span] & (self.columns[:span] <= self.col))[:, None, None]

        def attend(i, q, k, v):
            keys, values = c.keys[i][:rows], c.values[i][:rows]
            keys.index_copy_(2, self.col, k)
            values.index_copy_(2, self.col, v)
            return attention(self.model, q, keys[:, :, :span], values[:, :, :span], mask)
        embed = self.model.model.embed_tokens
        hidden = run_layers(self.model, embed(self.tok[:rows]), self.pos[:rows], attend)
        return self.model.lm_head(hidden[:, -1])

    def _replay(self, rows: int, span: int):
        """The step for (rows, span): a graph's replay and its output tensor, captured on
        first use; or, without capture, the eager step."""
        key = (rows, span)
        if key not in self.graphs:
            if not self.capture:
                return lambda: self._static_step(rows, span)
            device = self.device
            with torch.cuda.device(device):
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):  # warm-up: lazy initialisation never in a capture
                    self._static_step(rows, span)
                torch.cuda.current_stream(device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # thread_local: another thread of the process (a Ray actor's) may use CUDA
                # while this one captures.
                with torch.cuda.graph(graph, pool=self.pool, stream=torch.cuda.Stream(device),
                                      capture_error_mode="thread_local"):
                    out = self._static_step(rows, span)
            self.graphs[key] = (graph, out)
        graph, out = self.graphs[key]

        def run():
            with torch.cuda.device(self.device):
                graph.replay()
            return out
        return run

    def step(self, tok, pos, t: int):
        """Next-token logits (rows, V) after new token number ``t`` (from 0), ``tok``
        (rows, 1) at positions ``pos`` (rows, 1). With capture, the returned tensor is (a
        view of) the graph's output, overwritten by the next step. The step runs
        ``row_bucket(rows)`` rows; the rows past ``rows`` compute on stale inputs in their
        own cache rows and are dropped."""
        rows, column = tok.shape[0], self.width + t
        self.tok[:rows].copy_(tok)
        self.pos[:rows].copy_(pos)
        self.col.fill_(column)
        return self._replay(row_bucket(rows), min(_round_up(column + 1, SPAN_BLOCK),
                                                  self.columns.numel()))()[:rows]

    def keep(self, rows: torch.Tensor) -> torch.Tensor:
        """Keep ``rows`` (indices into the current rows) and as many finished rows as
        ``kept_rows`` pads them with, moved to the front of the cache's buffers; returns the
        indices kept."""
        alive = torch.zeros(self.rows, dtype=torch.bool, device=rows.device)
        alive[rows] = True
        kept = kept_rows(alive, self.rows)
        m, c = len(kept), self.cache
        if m < self.rows:
            for buffer in c.keys + c.values + [c.valid]:
                buffer[:m] = buffer.index_select(0, kept)
            self.rows = m
        return kept
