"""Data: corpora built from Debian packages, the SentencePiece vocabulary, seqio tasks.

`load_bundled(task)` reads a bundled evaluation split; `load_vocab()` the bundled
8k vocabulary; `resolve_vocabulary(spec)` any vocabulary a run names (a SentencePiece
path, a seqio.Vocabulary); `specjax.data.inputs` what the main job decodes; `specjax.data.tasks` (imports seqio/TensorFlow) registers the
seqio tasks; `python -m specjax.data.corpora` rebuilds the corpora.
"""
from specjax.data.splits import (BUNDLED_DIR, SPLITS, TASK_FILES, Example, load_bundled,
                                 read_split, write_split)
from specjax.data.inputs import DecodeInput
from specjax.data.user_vocab import (BUNDLED as BUNDLED_VOCABULARY, resolve_vocabulary,
                                     vocabulary_difference)
from specjax.data.vocab import Vocab, load_vocab, seqio_vocab

__all__ = ["load_bundled", "read_split", "write_split", "TASK_FILES", "SPLITS", "BUNDLED_DIR",
           "Example", "Vocab", "load_vocab", "seqio_vocab", "DecodeInput", "BUNDLED_VOCABULARY",
           "resolve_vocabulary", "vocabulary_difference"]
