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

import json
import os
from typing import Any, Dict, List, Optional, Sequence


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


def write(output_dir: str, records: List[Dict[str, Any]], summary: Dict[str, Any]) -> None:
  """`output_dir/results.jsonl` (one record a line) and `summary.json`."""
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, "results.jsonl"), "w", encoding="utf-8") as f:
    for rec in records:
      f.write(json.dumps(rec, ensure_ascii=False) + "\n")
  with open(os.path.join(output_dir, "summary.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=1)
