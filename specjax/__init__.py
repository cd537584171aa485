"""specjax: exact, batched, jit-compiled speculative decoding in JAX.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding", ICML 2023. See README.md for the tour.
"""
__version__ = "0.1.0"
