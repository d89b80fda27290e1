"""Atomic save and load of a run's full state (model, optimizer, buffer, counters, RNG, log
position), so that a run killed at any moment resumes to the same metrics.

One file, ``checkpoint/state.pt``, replaced atomically: a kill during a save leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import os

import torch

from replaytheory.io import atomic_write

FILE = "state.pt"


def save(directory: str, state: dict) -> None:
    """Write ``state`` (tensors, numpy arrays and plain Python objects) atomically."""
    atomic_write(os.path.join(directory, FILE), lambda fh: torch.save(state, fh), binary=True)


def load(directory: str) -> dict | None:
    """The saved state, or None if the run has no checkpoint yet."""
    path = os.path.join(directory, FILE)
    if not os.path.exists(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=False)


def rng_state(np_rng) -> dict:
    """The state of every random stream a run draws from (numpy generator, torch CPU/CUDA)."""
    state = {"numpy": np_rng.bit_generator.state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict, np_rng) -> None:
    """Put every random stream back to a state saved by ``rng_state``."""
    np_rng.bit_generator.state = state["numpy"]
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
