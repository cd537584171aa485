"""specjax: exact, batched, jit-compiled speculative decoding in JAX.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding", ICML 2023. See README.md for the tour. The subpackages:

  specjax.decode       the loops (autoregressive, speculative, beam, speculative beam)
  specjax.draft        drafters (model, n-gram, prompt lookup, hierarchical)
  specjax.verify       verifiers (reference, fused, sigmoid NOT exact) and Algorithm 1's step
  specjax.models       T5 1.1 and decoder-only networks, KV cache, the model protocol
  specjax.checkpoints  T5X legacy and Orbax checkpoints
  specjax.train        optax training, batches, training checkpoints, distillation
  specjax.data         corpora, vocabulary, seqio tasks
"""
__version__ = "0.1.0"

from specjax.checkpoints import load_t5x, load_t5x_for_model, save_t5x
from specjax.decode import (DecodeConfig, DecodeResult, autoregressive_decode, beam_search,
                            speculative_beam_search, speculative_decode)
from specjax.draft import ModelDrafter, PromptLookupDrafter
from specjax.models import build_model
from specjax.sampling import Sampling
from specjax.verify import speculative_step

__all__ = ["DecodeConfig", "DecodeResult", "Sampling", "autoregressive_decode",
           "speculative_decode", "beam_search", "speculative_beam_search", "ModelDrafter",
           "PromptLookupDrafter", "build_model", "load_t5x", "load_t5x_for_model", "save_t5x",
           "speculative_step"]
