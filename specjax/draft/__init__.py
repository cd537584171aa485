"""Drafters: who guesses the tokens that the target verifies.

Every drafter, chain or tree, implements one protocol (`Drafter`, `specjax.draft.base`): hashable
configuration plus params and a per-generation state; `propose` returns a `Proposal` (a chain
of guesses, their q, calls) or a `TreeProposal` (a tree's nodes), `update` takes what
verification `Accepted`. `DRAFTERS` names every shipped drafter class (`get_drafter` builds one
by name), as `specjax.verify.VERIFIERS` names the verifiers.
"""
from specjax.draft.base import Accepted, Drafter, DrafterDefaults, Proposal, sample_guess
from specjax.draft.feature import FeatureDrafter, FeatureDrafterState
from specjax.draft.feature_tree import FeatureTreeDrafter
from specjax.draft.hierarchical import HierarchicalDrafter
from specjax.draft.model import ModelDrafter, ModelDrafterState
from specjax.draft.ngram import BigramDrafter, NGramDrafter, NoState, UnigramDrafter
from specjax.draft.lookup_tree import PromptLookupTreeDrafter
from specjax.draft.ngram_tree import NGramTreeDrafter
from specjax.draft.prompt_lookup import PromptLookupDrafter
from specjax.draft.registry import DRAFTERS, drafter_fields, get_drafter
from specjax.draft.tree import DynamicTree, StaticTree, TreeModelDrafter, TreeProposal

__all__ = ["Drafter", "Accepted", "Proposal", "sample_guess", "ModelDrafter",
           "ModelDrafterState", "NGramDrafter", "UnigramDrafter", "BigramDrafter",
           "PromptLookupDrafter", "HierarchicalDrafter", "NoState", "StaticTree", "DynamicTree",
           "TreeModelDrafter", "TreeProposal", "PromptLookupTreeDrafter", "NGramTreeDrafter",
           "DRAFTERS", "get_drafter", "drafter_fields", "DrafterDefaults", "FeatureDrafter",
           "FeatureDrafterState", "FeatureTreeDrafter"]
