"""The project's figure look and the one way figures are saved (PNG + PDF, atomically)."""

from __future__ import annotations

import os

import matplotlib

from replaytheory.io import atomic_write

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")

RC = {"figure.dpi": 110, "savefig.dpi": 150, "font.size": 9, "axes.titlesize": 9,
      "axes.labelsize": 9, "legend.fontsize": 7, "xtick.labelsize": 8, "ytick.labelsize": 8,
      "axes.spines.top": False, "axes.spines.right": False, "savefig.bbox": "tight"}


def apply() -> None:
    """Set the shared rcParams."""
    matplotlib.rcParams.update(RC)


def save(fig, name: str, out_dir: str | None = None) -> list[str]:
    """Write ``fig`` as ``name.png`` and ``name.pdf`` into ``out_dir`` (default figures/out).

    Returns the paths written.
    """
    out = OUT_DIR if out_dir is None else out_dir
    paths = []
    for ext in ("png", "pdf"):
        path = os.path.join(out, f"{name}.{ext}")
        atomic_write(path, lambda fh, e=ext: fig.savefig(fh, format=e), binary=True)
        paths.append(path)
    return paths
