"""Gradient probes during a run: buffer probes (theory.md section 8) and long-range panels (section 11.1)."""
