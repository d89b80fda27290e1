"""The policy's choice lists, as plain tuples: config.py checks its fields against them.

This module imports nothing, so that config.py can name the choices without importing torch
(``models.DTYPES`` maps each name to its torch dtype).
"""

# The model's floating-point types (``model.dtype``), by their torch names.
DTYPE_NAMES = ("float32", "bfloat16", "float16")
