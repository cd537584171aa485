"""The application layer: the main job, its gin setup, command line, report and records, the
bundled pairs and the HF export. Nothing below it imports it.

  main      `run` / `cli`: the `specjax` command (`python -m specjax.main`)
  job       `decode_job`: plan -> load -> measure -> report
  settings  `JobSettings`: the job's settings as one frozen, typed object, checked when made
  plan      settings checked, models built, inputs framed (nothing loaded)
  loading   models and vocabulary from gin and T5X checkpoints
  measure   the weights loaded; the two decodes timed side by side (`specjax.timing`)
  report    outputs, Figure-1 trace, summary; `records` the JSONL
  gin_config, cli, prompts, scoring, bundled, export_hf, train_main
"""
from specjax.app.job import decode_job
from specjax.app.loading import (build_model, check_models, encode_inputs, load_model,
                                 load_params)
from specjax.app.main import cli, read_inputs, read_texts, run

__all__ = ["decode_job", "run", "cli", "read_inputs", "read_texts", "build_model",
           "check_models", "encode_inputs", "load_model", "load_params"]
