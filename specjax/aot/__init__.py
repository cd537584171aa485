"""A decode compiled for a GPU or TPU on a host without one, and read.

  specjax.aot.targets   compile-only devices: GPUs by XLA's target configs (carried by JAX's
                        CUDA plugin), TPUs by libtpu topology names
  specjax.aot.hlo       kernels, nested loops, custom calls and float32 temporaries of an
                        optimized HLO program
  specjax.aot.report    the pieces of a decode (steps and loops) compiled and reported

`python -m specjax.aot` is the command; `pip install 'specjax[aot]'` installs the compilers.
"""
