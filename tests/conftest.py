import atexit
import os
import shutil
import tempfile

# Figures and notebooks must not need a display or write into the home directory.
# matplotlib reads MPLCONFIGDIR when it is imported, while the tests are collected, before any
# fixture (tmp_path_factory) exists: a temporary folder removed when the session ends.
os.environ.setdefault("MPLBACKEND", "Agg")
if "MPLCONFIGDIR" not in os.environ:
    os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="mpl-")
    atexit.register(shutil.rmtree, os.environ["MPLCONFIGDIR"], ignore_errors=True)
# Warm starts (models.cache_dir) go to the repository's .cache, not the per-user default:
# kept between sessions (a warm start takes a minute) and out of the home directory. Runs
# started in subprocesses (sweeps, notebook kernels) inherit it.
os.environ.setdefault("LLM_EXPERIMENTS_CACHE", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache"))


import pytest  # noqa: E402  (after the environment above, which must precede matplotlib)
from hypothesis import settings  # noqa: E402

# Property tests check values, never speed: on a loaded 2-core machine hypothesis's default
# 200 ms deadline failed test_j_homogeneous_degree_zero with DeadlineExceeded.
settings.register_profile("no_deadline", deadline=None)
settings.load_profile("no_deadline")


@pytest.fixture
def drawn_by(monkeypatch):
    """``drawn_by(module)``: the dict (name -> Figure) that fills with the figures ``module``
    draws, its ``save`` replaced so the figures stay open for the test to read."""
    figs = {}

    def patch(module):
        def keep(fig, name, out_dir=None):
            figs[name] = fig
            return [f"{name}.png"]
        monkeypatch.setattr(module, "save", keep)
        return figs

    yield patch
    from figures import style
    for fig in figs.values():
        style.plt.close(fig)
