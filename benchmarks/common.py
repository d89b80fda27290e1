"""Shared pieces of the benchmark scripts: thread pinning, model shapes, tables, JSON results.

Every benchmark sets the torch thread count explicitly for every contender: on a small shared
machine the default (all cores) makes a loop wait on threads that another busy process holds
(a ~75x slowdown was measured here), so a comparison is only fair with the count fixed.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

# Model shapes (ModelConfig fields): the cpu_tiny model (~1.0M parameters with the addition
# vocabulary) and a ~3.2M-parameter one of the same family.
SIZES = {
    "tiny": {"hidden_size": 128, "layers": 4, "heads": 4, "kv_heads": 2,
             "intermediate_size": 512},
    "3m": {"hidden_size": 256, "layers": 4, "heads": 4, "kv_heads": 2,
           "intermediate_size": 768},
    # cpu_long's shape (0.25M parameters), run only when named (--sizes long)
    "long": {"hidden_size": 64, "layers": 4, "heads": 4, "kv_heads": 2,
             "intermediate_size": 256},
}
# The shapes a benchmark runs unless told otherwise (cpu_tiny's and a ~3M one).
DEFAULT_SIZES = ("tiny", "3m")


def set_threads(n: int) -> None:
    """Pin torch (intra-op) to ``n`` threads."""
    import torch
    torch.set_num_threads(int(n))


def random_policy(size: str, max_len: int = 128):
    """(model, tokenizer): a randomly initialised model of shape ``SIZES[size]`` (eval mode)
    with the addition char tokenizer. Speed does not depend on the weights."""
    from llm_experiments.config import Config
    from llm_experiments.policy.models import char_tokenizer, tiny_model
    from llm_experiments.tasks.arithmetic import AdditionTask
    cfg = Config()
    for key, val in SIZES[size].items():
        setattr(cfg.model, key, val)
    cfg.model.max_len = max_len
    tok = char_tokenizer(AdditionTask(eval_size=1).alphabet())
    return tiny_model(cfg, len(tok)).eval(), tok


def spread(values) -> dict:
    """min / median / max of a list of numbers."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def best_of(fn, repeats: int) -> float:
    """Fastest wall time of ``repeats`` calls of ``fn`` (seconds): the least disturbed one."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def print_table(rows: list[dict], columns: list[str]) -> None:
    """Print ``rows`` as an aligned text table (floats: 3 significant digits, at least units;
    a missing value prints as "-")."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)
    cells = [[fmt(r.get(c, "-")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def machine() -> dict:
    """Where and with what a result was measured (load average: was the machine busy?; the
    CPU's vector capability: which linear kernel is faster depends on it, kernels.py)."""
    import torch
    import transformers
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "load_average_1min": os.getloadavg()[0], "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_result(name: str, result: dict, folder: Path = RESULTS) -> Path:
    """Write ``result`` (plus ``machine()``) to ``<folder>/<name>.json`` (default folder
    ``benchmarks/results``)."""
    from replaytheory.io import write_json
    path = Path(folder) / f"{name}.json"
    write_json(str(path), {**result, "machine": machine()})
    print(f"wrote {path}")
    return path
