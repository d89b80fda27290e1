"""The policy model: loading, warm start, the direct forward and fast kernels."""
