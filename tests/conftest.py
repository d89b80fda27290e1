import os
import tempfile

# Figures and notebooks must not need a display or write into the home directory.
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("MPLCONFIGDIR", tempfile.mkdtemp(prefix="mpl-"))
