"""A hostile input for the hierarchical drafter (docs/results/hostile_probe.md): NaN in the
inner drafter's q is reported like any NaN logits, not verified as if M had drawn it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.decode import DecodeConfig, speculative_decode
from specjax.draft import HierarchicalDrafter, ModelDrafter
from specjax.testing import TableModel, random_table

V = 4


def test_a_broken_inner_model_is_an_error():
  # +inf logits give NaN q at temperature 1. A broken medium was already reported; the
  # inner's stayed inside the medium's own verification and the output came back silently.
  target, medium, small = random_table(1, V), random_table(2, V, 1.0), random_table(3, V, 0.5)
  params = {"medium": medium, "inner": jnp.full_like(small, jnp.inf)}
  inner = ModelDrafter(TableModel(V), 1, window=3)
  drafter = HierarchicalDrafter(medium=TableModel(V), inner=inner, max_gamma=2, inner_gamma=1)
  with pytest.raises(ValueError, match=r"NaN logits .* rows \[0\]"):
    speculative_decode(TableModel(V), target, drafter, params, np.array([[2, 3]], np.int32),
                       max_new_tokens=2, gamma=2, rng=jax.random.PRNGKey(0),
                       config=DecodeConfig(eos_id=-1, cache_len=24))
