"""The paper's tables and figures and the benchmarks, run from a checkout as
`python -m experiments.X`; such a run uses JAX's persistent compilation cache
(`specjax.runtime.compile_cache`: $SPECJAX_COMPILATION_CACHE, 'off' for none)."""
from specjax.runtime import compile_cache

compile_cache.enable_for_module_run()
