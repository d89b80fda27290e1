"""One look for every figure, the one way figures are saved (PNG + PDF, atomically), and the
command line every figure script shares (``figure_parser``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
import matplotlib.pyplot as plt  # noqa: E402

from replaytheory.io import atomic_write  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"

# Colour-blind-safe palette (Okabe-Ito); on-policy is always the first colour.
PALETTE = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7",
           "#F0E442"]
ON_POLICY_COLOR = PALETTE[0]
SHADE = "#DDDDDD"

RC = {"figure.dpi": 110, "savefig.dpi": 150, "font.size": 9, "axes.titlesize": 9,
      "axes.labelsize": 9, "legend.fontsize": 7, "xtick.labelsize": 8, "ytick.labelsize": 8,
      "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
      "axes.spines.right": False, "axes.prop_cycle": matplotlib.cycler(color=PALETTE[1:])}


def figure_parser(doc: str) -> argparse.ArgumentParser:
    """A figure script's argument parser: described by the first line of its module
    docstring ``doc``, with ``--out`` (the output folder; default ``OUT_DIR``)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", help="output folder (default figures/out)")
    return p


def apply() -> None:
    """Set the shared rcParams (done on import; call again after a style change)."""
    matplotlib.rcParams.update(RC)


apply()


def write_text(text: str, name: str, out_dir: str | os.PathLike | None = None) -> Path:
    """Write ``text`` to ``name`` (with its extension) in ``out_dir`` (default figures/out/,
    made if missing), atomically. Returns the path written."""
    out = Path(out_dir) if out_dir is not None else OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    atomic_write(str(path), lambda fh: fh.write(text))
    return path


def save(fig, name: str, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write ``name``.png and ``name``.pdf into ``out_dir`` (default figures/out/), atomically,
    then close the figure. Returns the paths written."""
    out = Path(out_dir) if out_dir is not None else OUT_DIR
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    paths = []
    for ext in ("png", "pdf"):
        path = out / f"{name}.{ext}"
        # No creation date in the PDF: the same figure is then the same bytes on every rebuild.
        meta = {"CreationDate": None} if ext == "pdf" else None
        atomic_write(str(path), lambda fh, e=ext, m=meta: fig.savefig(fh, format=e, metadata=m),
                     binary=True)
        paths.append(path)
    plt.close(fig)
    return paths
