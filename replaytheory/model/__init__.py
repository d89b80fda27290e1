"""The theory's math: compute model, noise, bound, the design objectives and their one optimiser (theory.md sections 3-5, 10, 11)."""
