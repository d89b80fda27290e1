"""Figure scripts: each reads saved results (or the theory code) and writes PNG + PDF."""
