"""The drafter registry and the one drafter protocol, through `specjax.draft`."""
import pytest

import specjax.draft as draft
from specjax.draft import DRAFTERS, Drafter, StaticTree, drafter_fields, get_drafter
from specjax.models import build_model
from specjax.models.decoder_only import DecoderOnlyConfig


def _model():
  return build_model(DecoderOnlyConfig(vocab_size=32, emb_dim=8, num_heads=1, num_layers=1,
                                       head_dim=8, mlp_dim=16))


def test_drafters_build_by_name_and_state_one_protocol():
  model, tree = _model(), StaticTree.from_spines((3, 1))
  offered = {"model": model, "vocab": 32, "max_gamma": 4, "tree": tree}
  chain = get_drafter("model", offered)
  assert chain == draft.ModelDrafter(model, max_gamma=4)
  assert (chain.tree, chain.lookahead, chain.models, chain.deterministic) == (
      None, 4, (model,), False)
  lookup = get_drafter("prompt_lookup", offered, max_ngram=2)
  assert lookup == draft.PromptLookupDrafter(vocab=32, max_gamma=4, max_ngram=2)
  assert lookup.models == () and lookup.deterministic
  wide = get_drafter("tree_model", offered)
  assert wide.tree == tree and wide.max_gamma == tree.max_depth == 3
  assert wide.lookahead == tree.grown == 4 and wide.models == (model,)
  lookup_tree = get_drafter("prompt_lookup_tree", offered, branches=3, depth=2)
  assert lookup_tree.lookahead == 6 and lookup_tree.max_gamma == 2 and lookup_tree.deterministic
  table = get_drafter("ngram", offered, order=2)
  assert get_drafter("ngram_tree", table=table, tree=tree).lookahead == tree.nodes
  for built in (chain, lookup, wide, lookup_tree, table):
    assert isinstance(built, Drafter)


def test_bad_names_and_fields_are_one_line_errors():
  with pytest.raises(ValueError, match="unknown drafter 'medusa'; choose one of"):
    get_drafter("medusa")
  with pytest.raises(ValueError, match="drafter 'model' .* has no field 'gamma'"):
    get_drafter("model", model=_model(), max_gamma=2, gamma=2)
  with pytest.raises(ValueError, match="drafter 'prompt_lookup' .* needs 'max_gamma'"):
    get_drafter("prompt_lookup", vocab=32)
  assert drafter_fields("tree_model") == ("model", "tree", "window", "catch_up", "unroll")
