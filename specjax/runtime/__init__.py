"""What a run stands on, apart from decoding itself:

  specjax.runtime.distributed    `jax.distributed` set up from the environment; which process
                                 writes and prints
  specjax.runtime.launch         `python -m specjax.runtime.launch`: N local processes of one run
  specjax.runtime.sharding       `Partitioner`: meshes, and how params, caches and rows shard
  specjax.runtime.compile_cache  JAX's persistent compilation cache, set up and checked
"""
