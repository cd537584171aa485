"""Export a specjax T5 (T5X names) to HuggingFace `T5ForConditionalGeneration`.

  python -m specjax.app.export_hf --checkpoint /ckpt/checkpoint_1000 \\
      --model_gin models/specjax_tiny_t5.gin --out /tmp/hf_t5

Name map (T5X -> HF; 2-D kernels are transposed, since torch `Linear.weight`
is [out, in] and a T5X kernel is [in, out]):
  token_embedder/embedding                         -> shared.weight  [V, E]
  encoder/relpos_bias/rel_embedding [H, 32]        -> encoder.block.0.layer.0.SelfAttention
                                                      .relative_attention_bias.weight [32, H]
  encoder/layers_i/attention/{query,key,value,out} -> encoder.block.i.layer.0.SelfAttention.{q,k,v,o}
  encoder/layers_i/pre_attention_layer_norm        -> encoder.block.i.layer.0.layer_norm
  encoder/layers_i/mlp/{wi_0,wi_1,wo}              -> encoder.block.i.layer.1.DenseReluDense.*
  encoder/layers_i/pre_mlp_layer_norm              -> encoder.block.i.layer.1.layer_norm
  encoder/encoder_norm                             -> encoder.final_layer_norm
  decoder/layers_i/self_attention (+ pre_self_attention_layer_norm)     -> layer.0
  decoder/layers_i/encoder_decoder_attention (+ pre_cross_...)          -> layer.1.EncDecAttention
  decoder/layers_i/mlp (+ pre_mlp_layer_norm)                           -> layer.2
  decoder/decoder_norm                             -> decoder.final_layer_norm
  decoder/logits_dense/kernel [E, V]               -> lm_head.weight [V, E]

Semantics checked against HF's modeling_t5.py: HF scales nothing inside attention
(T5X folds 1/sqrt(D) into the query initializer); 'gated-gelu' uses 'gelu_new', the
tanh approximation that flax's `nn.gelu` computes; RMS norm eps 1e-6; the relative
bias lives in block 0 only. T5 1.1 (separate `logits_dense`) exports with
`tie_word_embeddings=False` (no d_model**-0.5 output scaling, separate lm_head);
`logits_via_embedding=True` exports tied, where HF's scaling equals T5X's /sqrt(E).
torch and transformers are imported lazily (extra: `pip install torch==2.13.0 transformers`).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Any, Dict, Mapping, Optional

import numpy as np

from specjax import files
from specjax import command
from specjax.models.t5 import T5Config, T5Model
from specjax.params import flatten

_ATTN = {"query": "q", "key": "k", "value": "v", "out": "o"}
_MLP_ACTS = {("gelu", "linear"): "gated-gelu", ("relu",): "relu", ("gelu",): "gelu",
             ("relu", "linear"): "gated-relu", ("silu", "linear"): "gated-silu"}


def hf_config_dict(config: T5Config) -> Dict[str, Any]:
  """The HF `T5Config` keyword arguments equivalent to a specjax `T5Config`."""
  acts = tuple(config.mlp_activations)
  if acts not in _MLP_ACTS:
    raise ValueError(f"mlp_activations {acts} have no HuggingFace T5 equivalent; "
                     f"supported: {sorted(_MLP_ACTS)}")
  if config.num_encoder_layers < 1:
    raise ValueError("an HF T5 needs at least one encoder layer")
  return dict(vocab_size=config.vocab_size, d_model=config.emb_dim, d_kv=config.head_dim,
              d_ff=config.mlp_dim, num_layers=config.num_encoder_layers,
              num_decoder_layers=config.num_decoder_layers, num_heads=config.num_heads,
              relative_attention_num_buckets=32, relative_attention_max_distance=128,
              dropout_rate=0.0, layer_norm_epsilon=1e-6, feed_forward_proj=_MLP_ACTS[acts],
              tie_word_embeddings=bool(config.logits_via_embedding), is_encoder_decoder=True,
              decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)


def _attention(out: Dict[str, np.ndarray], tree: Mapping[str, Any], prefix: str) -> None:
  for t5x, hf in _ATTN.items():
    out[f"{prefix}.{hf}.weight"] = np.asarray(tree[t5x]["kernel"], np.float32).T


def _mlp(out: Dict[str, np.ndarray], tree: Mapping[str, Any], prefix: str) -> None:
  for name, node in tree.items():
    out[f"{prefix}.DenseReluDense.{name}.weight"] = np.asarray(node["kernel"], np.float32).T


# The sublayers of a T5 block in HF's order: (T5X module, HF attention module or None for the
# MLP, T5X layer norm before it).
_ENCODER_PARTS = (("attention", "SelfAttention", "pre_attention_layer_norm"),
                  ("mlp", None, "pre_mlp_layer_norm"))
_DECODER_PARTS = (("self_attention", "SelfAttention", "pre_self_attention_layer_norm"),
                  ("encoder_decoder_attention", "EncDecAttention",
                   "pre_cross_attention_layer_norm"),
                  ("mlp", None, "pre_mlp_layer_norm"))


def hf_state_dict(config: T5Config, params: Mapping[str, Any]) -> Dict[str, np.ndarray]:
  """specjax T5 params (T5X names) -> HF T5 state dict as float32 numpy arrays.

  Args:
    config: the specjax `T5Config` the params belong to.
    params: nested dict of arrays with T5X names (checked against `config`).
  Returns:
    {hf_name: float32 array}, without the tied `encoder/decoder.embed_tokens` aliases.
  """
  if not isinstance(config, T5Config):
    raise ValueError(f"only T5 models export to HF T5, got {type(config).__name__}")
  T5Model(config).check_params(params, "params to export")
  enc, dec = params["encoder"], params["decoder"]
  ln = lambda node: np.asarray(node["scale"], np.float32)
  out = {"shared.weight": np.asarray(params["token_embedder"]["embedding"], np.float32)}
  out["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = \
      np.asarray(enc["relpos_bias"]["rel_embedding"], np.float32).T
  out["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = \
      np.asarray(dec["relpos_bias"]["rel_embedding"], np.float32).T
  for stack, tree, count, parts in (("encoder", enc, config.num_encoder_layers, _ENCODER_PARTS),
                                    ("decoder", dec, config.num_decoder_layers, _DECODER_PARTS)):
    for i in range(count):
      layer = tree[f"layers_{i}"]
      for index, (t5x, hf, norm) in enumerate(parts):
        prefix = f"{stack}.block.{i}.layer.{index}"
        if hf is None:
          _mlp(out, layer[t5x], prefix)
        else:
          _attention(out, layer[t5x], f"{prefix}.{hf}")
        out[f"{prefix}.layer_norm.weight"] = ln(layer[norm])
    out[f"{stack}.final_layer_norm.weight"] = ln(tree[f"{stack}_norm"])
  if not config.logits_via_embedding:
    out["lm_head.weight"] = np.asarray(dec["logits_dense"]["kernel"], np.float32).T
  return out


def to_hf(config: T5Config, params: Mapping[str, Any]):
  """An HF `T5ForConditionalGeneration` (eval mode, float32) holding these weights."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  state = hf_state_dict(config, params)
  hf = transformers.T5ForConditionalGeneration(transformers.T5Config(**hf_config_dict(config)))
  tensors = {k: torch.from_numpy(np.array(v, np.float32, copy=True)) for k, v in state.items()}
  if "lm_head.weight" in tensors:  # T5 1.1: untie (transformers 5 ties lm_head by default)
    hf.lm_head.weight = torch.nn.Parameter(tensors["lm_head.weight"].clone())
  missing, unexpected = hf.load_state_dict(tensors, strict=False)
  aliases = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"}
  bad_missing = sorted(set(missing) - aliases)
  if bad_missing or unexpected:
    raise ValueError(f"HF T5 state dict mismatch: missing {bad_missing}, unexpected "
                     f"{sorted(unexpected)}")
  hf.config.scale_decoder_outputs = bool(config.logits_via_embedding)
  return hf.eval()


EXPORT_FILES = ("config.json", "generation_config.json")
EXPORT_SUFFIXES = (".safetensors", ".safetensors.index.json")
"""The names an HF export folder holds; a folder holding anything else is never replaced."""


def _inside(path: str, folder: str) -> bool:
  path, folder = os.path.realpath(path), os.path.realpath(folder)
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_out_dir(out_dir: str, checkpoint: Optional[str] = None) -> str:
  """`out_dir` as a path that `save_hf` may fill or replace; ValueError naming it if it is a
  remote URL, a file or link, the checkpoint being exported (or a folder holding it, or one
  inside it), or a folder holding anything an HF export does not write (config.json,
  generation_config.json, *.safetensors)."""
  out_dir = os.path.abspath(files.check_local(out_dir, "--out"))
  if os.path.islink(out_dir) or (os.path.lexists(out_dir) and not os.path.isdir(out_dir)):
    raise ValueError(f"--out {out_dir} is a file or a link, not a folder to export into")
  if checkpoint is not None and (_inside(checkpoint, out_dir) or _inside(out_dir, checkpoint)):
    raise ValueError(f"--out {out_dir} holds or lies inside the checkpoint being exported "
                     f"({checkpoint}); give a folder of its own")
  if os.path.isdir(out_dir):
    others = sorted(name for name in os.listdir(out_dir)
                    if not (name in EXPORT_FILES or name.endswith(EXPORT_SUFFIXES))
                    or not os.path.isfile(os.path.join(out_dir, name))
                    or os.path.islink(os.path.join(out_dir, name)))
    if others:
      raise ValueError(f"--out {out_dir} holds no HF model alone ({others[0]!r} is not a file "
                       "an HF export writes); refusing to replace it: give a new or an earlier "
                       "export's folder")
  return out_dir


def save_hf(config: T5Config, params: Mapping[str, Any], out_dir: str,
            checkpoint: Optional[str] = None) -> str:
  """Writes an HF model folder (`config.json`, `model.safetensors`); returns out_dir.

  `config.json` keeps `tie_word_embeddings` as the T5X model has it, so
  `T5ForConditionalGeneration.from_pretrained(out_dir)` rebuilds the same function.
  The folder is written under a temporary sibling name and renamed into place, so an
  earlier export there is replaced whole (none of its files stay) or, on failure, kept.
  Only an earlier export is ever replaced (`check_out_dir`, with `checkpoint` the folder the
  weights came from). Its files are readable by all (mode 0644), its folder 0755.
  """
  out_dir = check_out_dir(out_dir, checkpoint)
  hf = to_hf(config, params)
  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
  old = None
  try:
    hf.save_pretrained(tmp)
    path = os.path.join(tmp, "config.json")
    data = files.read_json(path, files.MIB, "the exported config.json")
    data["tie_word_embeddings"] = bool(config.logits_via_embedding)
    data.pop("scale_decoder_outputs", None)
    files.write_json(path, data, indent=2)
    for name in os.listdir(tmp):
      os.chmod(os.path.join(tmp, name), 0o644)  # safetensors writes 0600
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; an export folder is an ordinary one
    if os.path.isdir(check_out_dir(out_dir, checkpoint)):
      old = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-", dir=parent)
      os.rename(out_dir, os.path.join(old, "previous"))
    os.rename(tmp, out_dir)
  except BaseException:
    if old is not None and not os.path.lexists(out_dir):
      os.rename(os.path.join(old, "previous"), out_dir)
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  finally:
    if old is not None:
      shutil.rmtree(old, ignore_errors=True)
  return out_dir


def main(argv=None) -> None:
  """CLI: a T5X checkpoint + model gin file -> an HF model folder."""
  parser = command.ArgumentParser(prog="python -m specjax.app.export_hf", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--checkpoint", required=True, help="T5X checkpoint_N folder")
  parser.add_argument("--model_gin", required=True, help="e.g. models/t5_1_1_small.gin")
  parser.add_argument("--out", required=True, help="output folder")
  args = parser.parse_args(argv)
  from specjax.app import gin_config  # pylint: disable=import-outside-toplevel
  from specjax.app.loading import load_params  # pylint: disable=import-outside-toplevel
  files.check_local(args.checkpoint, "--checkpoint")
  check_out_dir(args.out, args.checkpoint)  # before any weights are read
  # Read with the restricted model-gin parser: the argument is a file name, never gin text.
  config = gin_config.model_config_from_file(args.model_gin)
  if not isinstance(config, T5Config):
    raise ValueError(f"{args.model_gin} is not a T5 model: only T5 exports to HF T5")
  model = T5Model(config)
  params = load_params(model, args.checkpoint, 0)
  save_hf(model.config, params, args.out, args.checkpoint)
  print(f"wrote {args.out} ({len(list(flatten(params)))} T5X arrays)")


def cli(argv=None) -> int:
  """The command: `main` with the project's error contract (`command.run_cli`)."""
  return command.run_cli(main, argv)


if __name__ == "__main__":
  sys.exit(cli())
