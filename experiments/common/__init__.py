"""Shared plumbing of the experiment scripts, one module per concern.

  pairs     the target/draft pairs: gin-named, bundled, or random-init stand-ins
  cli       the scripts' command line: gin flags, --pair, --fast, --output_dir
  inputs    evaluation examples, n-gram corpora, output ids, BLEU and perplexity
  checks    argument checks of the scripts' settings
  compare   decoders side by side per example, with the standard columns
  timed     in-loop model, drafter and verifier calls (c, r(γ))
  output    the output folder: markdown, CSV, JSON, plots
  decoding  the experiments' DecodeConfig and model drafter

Where a pair comes from (in this order):
1. gin: `TARGET_MODEL` / `DRAFT_MODEL` (model gin files) and `TARGET_CHECKPOINT` /
   `DRAFT_CHECKPOINT` (T5X checkpoints, or None for random init), as in runs/decode.gin;
   the run then uses that one pair, named 'gin'.
2. a preset, `--pair lm|translate`: the bundled pair (`specjax.app.bundled`,
   `specjax/assets/pairs/NAME/{target,draft}/`, made by experiments/train_bundled.py);
3. while those are not shipped: a random-init tiny pair of the preset's family, labelled
   "random init: numbers are meaningless" in every output.
"""
