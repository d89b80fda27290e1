"""One look for every figure: sizes, colours, and saving PNG + PDF into figures/out/."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
import matplotlib.pyplot as plt  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"

# Colour-blind-safe palette (Okabe-Ito); on-policy is always the first colour.
PALETTE = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#D55E00", "#0072B2", "#CC79A7",
           "#F0E442"]
ON_POLICY_COLOR = PALETTE[0]
SHADE = "#DDDDDD"

plt.rcParams.update({
    "figure.dpi": 110, "savefig.dpi": 150, "font.size": 9, "axes.titlesize": 10,
    "axes.labelsize": 9, "legend.fontsize": 8, "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False,
    "axes.prop_cycle": matplotlib.cycler(color=PALETTE[1:]),
})


def save(fig, name: str, out_dir: str | os.PathLike | None = None) -> list[Path]:
    """Write ``name``.png and ``name``.pdf into ``out_dir`` (default figures/out/); close fig."""
    out = Path(out_dir) if out_dir is not None else OUT_DIR
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    for p in paths:
        fig.savefig(p)
    plt.close(fig)
    return paths
