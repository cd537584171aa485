"""The main job: decode with a target/draft pair, autoregressive vs speculative.

  python -m specjax.main                                   # the bundled default
  python -m specjax.main --gin_file=runs/decode.gin \\
      --gin.TARGET_CHECKPOINT="'/ckpt/t5_xxl'" --gin.TARGET_MODEL="'models/t5_1_1_xxl.gin'" \\
      --gin.DRAFT_CHECKPOINT="'/ckpt/t5_small'" --gin.DRAFT_MODEL="'models/t5_1_1_small.gin'" \\
      --gin.VOCABULARY="'/vocabs/cc_all.32000/sentencepiece.model'" \\
      --prompt "translate English to German: The house is wonderful."

Your own T5X checkpoints bring their own vocabulary: bind VOCABULARY (a SentencePiece
model path, or T5X's `@seqio.SentencePieceVocabulary()`); inputs may also come from any
registered seqio task (--task, or MIXTURE_OR_TASK_NAME with TASK_FEATURE_LENGTHS). See
runs/decode.gin and the README's "Your own T5X checkpoints".

Prints the outputs, a Figure-1 trace of the first example and a summary table
(α, tokens per target call, walltimes, speedup, greedy identity); writes the
same to `output_dir`: results.jsonl with T5X infer.py's fields (`inputs`,
`prediction`, `prediction_tokens`, `score` when asked) and specjax's, and
summary.json. As the `specjax` command (`cli`), a user's error is one line on
stderr and exit status 2 (`--verbose` adds the traceback).

Many devices: `--gin.NUM_PARTITIONS=8` splits each model over 8 devices (the
'model' mesh axis; the rest of `jax.devices()` is the 'data' axis, see
`specjax.runtime.sharding`). Multi-host: call `jax.distributed.initialize()` first on
every host and run this same command on each (jax.devices() then spans all).
"""
from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import gin

from specjax.runtime import compile_cache, distributed
from specjax.app import cli as cli_lib
from specjax.app import gin_config
from specjax.app.job import decode_job
from specjax.data import Vocab
from specjax.data import inputs as inputs_lib

gin_config.register(Vocab, "specjax.data")  # VOCABULARY = @Vocab() (model_path, extra_ids)


def read_inputs(args, feature_lengths: Optional[Mapping[str, int]] = None
                ) -> Tuple[List[inputs_lib.DecodeInput], Any]:
  """Inputs from --prompt (repeatable), --input_file (one per line) and --task NAME[:split].

  --task takes a bundled split ('translate_en_de', 'summarize_ddtp', 'lm_ddtp_en') or any
  registered seqio task or mixture ('specjax_translate_en_de:validation', or your own);
  language-modelling documents are cut to their first `--prompt_words` words.
  Returns (inputs, the task's vocabulary or None).
  """
  for i, prompt in enumerate(args.prompt or []):
    if not prompt.strip():
      raise ValueError(f"--prompt {i + 1} is empty: give it text to decode (an --input_file's "
                       "blank lines are skipped alike)")
  found = [inputs_lib.DecodeInput(check_utf8(p, f"--prompt {i + 1}"))
           for i, p in enumerate(args.prompt or [])]
  if args.input_file:
    found += [inputs_lib.DecodeInput(t) for t in inputs_lib.read_input_file(args.input_file)]
  task_vocabulary = None
  if args.task:
    task_found, task_vocabulary = inputs_lib.task_inputs(
        args.task, getattr(args, "num_examples", 16), getattr(args, "prompt_words", 12),
        feature_lengths)
    found += task_found
  return found, task_vocabulary


def check_utf8(text: str, what: str) -> str:
  """`text` if it is valid Unicode; ValueError naming the first byte that was not UTF-8
  (Python keeps such argv bytes as lone surrogates, which the tokenizer cannot take)."""
  for pos, ch in enumerate(text):
    if 0xD800 <= ord(ch) <= 0xDFFF:
      byte = f"0x{ord(ch) - 0xDC00:02x}" if ord(ch) >= 0xDC80 else "a lone surrogate"
      raise ValueError(f"{what} is not UTF-8: character {pos} is the byte {byte} (is the "
                       "terminal's encoding Latin-1? pass UTF-8 text)")
  return text


def read_texts(args) -> List[str]:
  """The texts of `read_inputs`."""
  return [i.text for i in read_inputs(args)[0]]


DEFAULT_GIN = "runs/default.gin"


def refuse_beam_search() -> None:
  """ValueError when the parsed gin configures beam search (decoding/beam.gin,
  beam_speculative.gin): the main job does not run it, and their GAMMA would silently replace
  the run's."""
  for name in ("speculative_beam_search", "beam_search"):
    try:
      gin.query_parameter(f"{name}.beam_size")
    except ValueError:
      continue
    raise ValueError(f"the gin files configure {name} (decoding/beam*.gin), which the main job "
                     f"does not run: call specjax.decode.{name} from Python, where those "
                     "bindings apply, or drop the file")


def run(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
  """The main job from command-line arguments; errors propagate (see `cli` for the command)."""
  argv = sys.argv[1:] if argv is None else list(argv)
  gin_files, bindings, paths, rest = gin_config.split_gin_args(argv)
  parser = cli_lib.build_parser(__doc__)
  args = parser.parse_args(rest)
  cli_lib.check_counts(parser, args, ["num_examples", "prompt_words"])
  compile_cache.enable_from(args)  # before the first compile
  distributed.initialize_from(args)  # many processes: before any other JAX call
  default = str(gin_config.GIN_DIR / DEFAULT_GIN)  # specjax's own, whatever the folder holds
  gin_config.parse(gin_config.run_files(gin_files, default, paths), bindings, paths)
  refuse_beam_search()
  for note in gin_config.model_notes():  # what a T5X model gin file held that is not read
    print(f"specjax: {note}", file=sys.stderr)
  inputs_lib.import_modules(gin_config.query_macro("MIXTURE_OR_TASK_MODULE"))
  lengths = gin_config.query_macro("TASK_FEATURE_LENGTHS")
  examples, task_vocabulary = read_inputs(args, lengths)
  default_task = (gin_config.query_macro("MIXTURE_OR_TASK_NAME")
                  or gin_config.query_macro("DEFAULT_TASK"))
  if not examples and default_task:
    args.task = default_task
    examples, task_vocabulary = read_inputs(args, lengths)
  if not examples:
    raise ValueError("no inputs: give --prompt, --input_file or --task (or bind "
                     "MIXTURE_OR_TASK_NAME)")
  # Many processes decode one batch: each must hold the same inputs and settings.
  distributed.check_same(json.dumps([gin_files, bindings, paths]).encode(), "the gin settings")
  distributed.check_same(json.dumps([e.text for e in examples]).encode(), "the inputs")
  unread_lengths = set(lengths) - {"inputs", "targets"} if isinstance(lengths, dict) else set()
  for key in sorted(unread_lengths):
    print(f"specjax: TASK_FEATURE_LENGTHS[{key!r}] sets no length here (the main job reads "
          "'inputs' and 'targets'; seqio trims a task's other features by it)", file=sys.stderr)
  try:
    summary = gin.get_configurable(decode_job)(examples, plain=args.plain,
                                               task_vocabulary=task_vocabulary)
  except TypeError as e:
    unbound = gin_config.unbound_macro(e)
    if unbound is None:
      raise
    raise unbound from e
  for binding in gin_config.uncalled_bindings(bindings):
    print(f"specjax: --gin.{binding} changed nothing: this run never called "
          f"{binding.split('=')[0].strip().rsplit('.', 1)[0]}", file=sys.stderr)
  return summary


def cli(argv: Optional[Sequence[str]] = None) -> int:
  """The `specjax` command: `run`, with a user's error as one line on stderr and exit status
  2 (`--verbose`: the traceback too); Ctrl-C exits with 130 (`cli_lib.run_cli`)."""
  return cli_lib.run_cli(run, argv)


if __name__ == "__main__":
  sys.exit(cli())
