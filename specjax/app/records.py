"""The main job's JSON lines: T5X infer.py's fields, then specjax's own.

One record per example, diffable against `t5x/infer.py`'s predict output:

  inputs             {'inputs_pretokenized': text, ...the task's other *_pretokenized}
  prediction         the speculative output's text (the vocabulary's decode, through EOS)
  prediction_tokens  its token ids (a final EOS included, as T5X's output_ids writes them)
  score              the target's log-likelihood of the prediction (T5X's `score` mode:
                     raw logits); only when the job is asked for scores

and specjax's: `input` (the text), `input_tokens` (what the model was given: encoder
inputs, or the prompt with its BOS), `autoregressive` / `autoregressive_tokens` (the
baseline), `speculative` (= prediction), `target_calls`, `tokens`, `alpha`.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence

from specjax import files


def record(inp: Any, input_tokens: Sequence[int], ar_ids: Sequence[int],
           spec_ids: Sequence[int], vocab: Any, *, target_calls: int, alpha: float,
           score: Optional[float] = None) -> Dict[str, Any]:
  """One example's record.

  Args:
    inp: its `specjax.data.DecodeInput`.
    input_tokens: the model's input row, without padding.
    ar_ids / spec_ids: the autoregressive and speculative outputs (EOS included if emitted).
    vocab: the run's vocabulary (decode).
    target_calls / alpha: speculative statistics of the row.
    score: the prediction's log-likelihood, or None (not asked).
  """
  prediction = vocab.decode(spec_ids)
  inputs = {"inputs_pretokenized": inp.text, **dict(inp.pretokenized)}
  out = {"inputs": inputs, "prediction": prediction,
         "prediction_tokens": [int(t) for t in spec_ids]}
  if score is not None:
    out["score"] = float(score)
  out.update({"input": inp.text, "input_tokens": [int(t) for t in input_tokens],
              "autoregressive": vocab.decode(ar_ids),
              "autoregressive_tokens": [int(t) for t in ar_ids],
              "speculative": prediction, "target_calls": int(target_calls),
              "tokens": len(spec_ids), "alpha": float(alpha)})
  return out


OUTPUT_FILES = ("results.jsonl", "summary.json")
"""What `write` puts in the output folder."""
EARLIER = "earlier"
"""The folder of OUTPUT_DIR where `write` keeps the results of earlier runs."""
LOCK_WAIT_S = 120.0
"""How long a run waits for another run writing into the same OUTPUT_DIR (a write takes
milliseconds) before it gives up with an error."""


@contextlib.contextmanager
def writing(output_dir: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
  """Holds `output_dir`'s write lock (an exclusive `flock` on the folder itself, so nothing
  is left in it) within: two runs writing one folder take turns, so neither moves the
  other's results while they are half-written.

  Raises:
    TimeoutError: another process held the lock for more than `wait_s` seconds.
  """
  fd = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
  try:
    deadline = time.monotonic() + wait_s
    while True:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
      except BlockingIOError:
        if time.monotonic() > deadline:
          raise TimeoutError(f"another run has been writing its results to {output_dir} for "
                             f"over {wait_s:.0f} s (the folder is locked): wait for it to "
                             "finish, or give this run another OUTPUT_DIR") from None
        time.sleep(0.02)
    yield
  finally:
    os.close(fd)  # releases the lock


def check_destinations(output_dir: str) -> None:
  """ValueError naming an output file that `write` could not replace (a symlink, a
  folder) or an `earlier/` it could not keep old results in; run before anything is
  decoded."""
  for name in OUTPUT_FILES:
    files.check_destination(os.path.join(output_dir, name), "the output file")
  earlier = os.path.join(output_dir, EARLIER)
  if files.is_remote(output_dir):
    from specjax import remote  # pylint: disable=import-outside-toplevel
    if remote.exists(earlier):
      raise ValueError(f"{earlier} is an object, not a folder: it is where an earlier run's "
                       "results are kept; move it away")
    return
  if os.path.islink(earlier) or (os.path.lexists(earlier) and not os.path.isdir(earlier)):
    raise ValueError(f"{earlier} is not a folder (a link or a file): it is where an earlier "
                     "run's results are kept; move it away")


def keep_earlier(output_dir: str) -> Optional[str]:
  """Moves an earlier run's results.jsonl and summary.json out of `output_dir` into
  `output_dir/earlier/<when they were written>/` (e.g. earlier/20261128-103105/), as T5X
  keeps earlier inference results instead of writing over them. Returns that folder, or
  None when there was nothing to keep."""
  present = [n for n in OUTPUT_FILES if os.path.lexists(os.path.join(output_dir, n))]
  if not present:
    return None
  check_destinations(output_dir)
  written = max(os.lstat(os.path.join(output_dir, n)).st_mtime for n in present)
  stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(written))
  os.makedirs(os.path.join(output_dir, EARLIER), exist_ok=True)
  for i in range(1, 1000):
    folder = os.path.join(output_dir, EARLIER, stamp if i == 1 else f"{stamp}-{i}")
    try:
      os.mkdir(folder)
      break
    except FileExistsError:
      continue
  else:
    raise FileExistsError(f"too many earlier runs kept in {output_dir}/{EARLIER}/{stamp}-*")
  for name in present:
    os.replace(os.path.join(output_dir, name), os.path.join(folder, name))
  return folder


def write(output_dir: str, records: List[Dict[str, Any]], summary: Dict[str, Any]
          ) -> Optional[str]:
  """`output_dir/results.jsonl` (one record a line) and `summary.json`, together: an earlier
  run's pair is first moved to `earlier/` (`keep_earlier`), then both are written under
  temporary names and renamed into place; on a failure (a full disk, a file size limit) the
  earlier pair is moved back, so nothing changes; the error names the file. Runs writing
  one local folder at once take turns (`writing`), so none loses another's results. Returns
  the folder the earlier pair went to, or None."""
  results = "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in records)
  outputs = {os.path.join(output_dir, OUTPUT_FILES[0]): results.encode("utf-8"),
             os.path.join(output_dir, OUTPUT_FILES[1]):
                 json.dumps(summary, indent=1).encode("utf-8")}
  if files.is_remote(output_dir):
    return _write_remote(output_dir, outputs)
  os.makedirs(output_dir, exist_ok=True)
  check_destinations(output_dir)
  with writing(output_dir):
    kept = keep_earlier(output_dir)
    try:
      files.write_atomic(outputs)
    except BaseException:
      if kept:  # the earlier pair goes back where it was: a failed run changes nothing
        _put_back(kept, output_dir)
      raise
  return kept


def _write_remote(output_dir: str, outputs: Dict[str, bytes]) -> Optional[str]:
  """`write` into a gs:// folder: an earlier run's objects are first copied whole to
  `earlier/<when they were kept>/`, then each output is uploaded whole (results first,
  summary last); on a failure the earlier objects are written back (a bucket has no renames:
  each object is its old content or the whole new one)."""
  from specjax import remote  # pylint: disable=import-outside-toplevel
  check_destinations(output_dir)
  old = {}
  for path in outputs:
    if remote.exists(path):
      old[path] = files.read_bytes(path, 2**40, "the earlier output")
  kept = None
  if old:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    taken = remote.children(os.path.join(output_dir, EARLIER))
    name = next(f"{stamp}-{i}" if i > 1 else stamp for i in range(1, 1000)
                if (f"{stamp}-{i}" if i > 1 else stamp) not in taken)
    kept = os.path.join(output_dir, EARLIER, name)
    remote.write_objects({os.path.join(kept, os.path.basename(p)): v for p, v in old.items()})
  try:
    remote.write_objects(outputs)
  except BaseException:
    for path in outputs:  # best effort: the server may be gone
      with contextlib.suppress(OSError, ValueError):
        if path in old:
          remote.write_objects({path: old[path]})
        else:
          remote.delete(path)
    raise
  return kept


def _put_back(kept: str, output_dir: str) -> None:
  """Moves the files `keep_earlier` moved to `kept` back into `output_dir`, and removes the
  folders it made when they are empty."""
  for name in os.listdir(kept):
    os.replace(os.path.join(kept, name), os.path.join(output_dir, name))
  for folder in (kept, os.path.dirname(kept)):
    try:
      os.rmdir(folder)
    except OSError:  # earlier/ holds older runs
      break
