"""Run from a checkout as `python -m experiments.X`: the paper's tables and figure
(`experiments.paper.NAME`), the benchmarks (`experiments.bench.NAME`), and the tools that
train, ship and check the bundled pairs (`train_bundled`, `eval_pairs`, `fingerprint`,
`distill_compare`); the harness they share is `experiments.common`. Such a
run uses JAX's persistent compilation cache (`specjax.runtime.compile_cache`:
$SPECJAX_COMPILATION_CACHE, 'off' for none)."""
from specjax.runtime import compile_cache

compile_cache.enable_for_module_run()
