"""Fused kernels (Pallas, with XLA paths for CPU) used by `specjax.verifiers`."""
from specjax.kernels.fused_verify import (draw_correction, draw_from_rows, exponential_at,
                                          key_words, threefry2x32)

__all__ = ["draw_correction", "draw_from_rows", "exponential_at", "key_words", "threefry2x32"]
