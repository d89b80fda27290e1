"""Simulators of replay and of the asynchronous pipeline, and the simulated validation (theory.md sections 1-2, 4, 7)."""
