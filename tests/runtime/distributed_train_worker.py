"""One process of a data-parallel training job (tests/runtime/test_distributed.py runs it under
`python -m specjax.runtime.launch`): a tiny decoder-only LM on fixed random batches, checkpointed
collectively; `--stop_after` cuts the run short, a later run resumes it."""
import argparse
import sys

import numpy as np

VOCAB, BATCH, LENGTH = 64, 8, 8


def batch_fn(step):
  """The global batch of `step` (the same in every process)."""
  tokens = np.random.default_rng(step).integers(2, VOCAB, (BATCH, LENGTH + 1)).astype(np.int32)
  return {"decoder_input_tokens": tokens[:, :-1], "decoder_target_tokens": tokens[:, 1:],
          "decoder_loss_weights": np.ones((BATCH, LENGTH), np.float32)}


def main(argv=None):
  parser = argparse.ArgumentParser()
  parser.add_argument("--model_dir", required=True)
  parser.add_argument("--num_steps", type=int, default=4)
  parser.add_argument("--checkpoint_every", type=int, default=2)
  parser.add_argument("--stop_after", type=int, default=None)
  parser.add_argument("--sharded_copy", default=None,
                      help="also write the final params split over a model axis across the "
                      "processes (each process writes its own half) into this folder")
  args = parser.parse_args(argv)
  # pylint: disable=import-outside-toplevel
  from specjax.runtime import distributed
  distributed.initialize()
  from specjax.models.decoder_only import DecoderOnlyConfig, DecoderOnlyModel
  from specjax.runtime.sharding import Partitioner
  from specjax.train import OptimizerConfig, Trainer
  from specjax.train.collective import fit
  model = DecoderOnlyModel(DecoderOnlyConfig(vocab_size=VOCAB, emb_dim=16, num_heads=2,
                                             num_layers=1, head_dim=8, mlp_dim=32,
                                             logits_via_embedding=False))
  trainer = Trainer(model, OptimizerConfig(learning_rate=1e-2, warmup_steps=1), args.num_steps)
  state = fit(trainer, batch_fn, args.model_dir, num_steps=args.num_steps,
              checkpoint_every=args.checkpoint_every, partitioner=Partitioner(),
              init_params=model.init(0), stop_after=args.stop_after)
  if args.sharded_copy:
    import jax
    from specjax.checkpoints import save_t5x_collective
    split = Partitioner(num_partitions=jax.device_count())
    params = jax.device_put(state.params, split.param_shardings(state.params))
    save_t5x_collective(params, args.sharded_copy, step=int(state.step))
    whole, halves = distributed.gather((state.params, params))  # every process: all of both
    if not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(whole),
                                                    jax.tree.leaves(halves))):
      raise AssertionError("gathering the split params does not give the replicated ones")
  print(f"process {distributed.info().process_id}: step {int(state.step)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
