"""specjax: exact, batched, jit-compiled speculative decoding in JAX.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding", ICML 2023. See README.md for the tour. The subpackages:

  specjax.decode       the loops (autoregressive, speculative, beam, speculative beam; streaming
                       over B slots with `slots=`)
  specjax.draft        drafters (model, n-gram, prompt lookup, hierarchical)
  specjax.verify       verifiers (reference, fused, sigmoid NOT exact) and Algorithm 1's step
  specjax.models       T5 1.1 and decoder-only networks, KV cache, the model protocol
  specjax.checkpoints  T5X legacy and Orbax checkpoints
  specjax.train        optax training, batches, training checkpoints, distillation
  specjax.data         corpora, vocabulary, seqio tasks
  specjax.runtime      sharding, multi-process runs, the launcher, the compile cache
  specjax.aot          decoding compiled for a GPU or TPU this host does not have, and read
  specjax.generate     strings in, texts out (a `Generator` keeps a loaded pair for more calls)
"""
__version__ = "0.1.0"

# Exported lazily (PEP 562), so `from specjax.checkpoints import load_t5x` reads a checkpoint
# without importing jax or flax.
_EXPORTS = {
    "DecodeConfig": "specjax.decode", "DecodeResult": "specjax.decode",
    "autoregressive_decode": "specjax.decode", "speculative_decode": "specjax.decode",
    "beam_search": "specjax.decode", "speculative_beam_search": "specjax.decode",
    "CostTable": "specjax.decode", "calibrate_costs": "specjax.decode",
    "ModelDrafter": "specjax.draft", "PromptLookupDrafter": "specjax.draft",
    "build_model": "specjax.models", "Sampling": "specjax.sampling",
    "speculative_step": "specjax.verify", "load_t5x": "specjax.checkpoints",
    "load_t5x_for_model": "specjax.checkpoints", "save_t5x": "specjax.checkpoints",
    "generate": "specjax.app.generate", "Generator": "specjax.app.generate",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    import importlib  # pylint: disable=import-outside-toplevel
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'specjax' has no attribute {name!r}")
