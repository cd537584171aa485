"""Drafters: who guesses the tokens that the target verifies.

Every drafter, chain or tree, implements one protocol (`Drafter`, `specjax.draft.base`): hashable
configuration plus params and a per-generation state; `propose` returns a `Proposal` (a chain
of guesses, their q, calls) or a `TreeProposal` (a tree's nodes), `update` takes what
verification `Accepted`. `DRAFTERS` names every drafter class (`get_drafter` builds one by
name; `register_drafter` adds your own), as `specjax.verify.VERIFIERS` names the verifiers.
"""
from specjax.draft.base import Accepted, Drafter, DrafterDefaults, Proposal, sample_guess
from specjax.draft.feature import FeatureDrafter, FeatureDrafterState, FeatureTreeDrafter
from specjax.draft.hierarchical import HierarchicalDrafter
from specjax.draft.model import ModelDrafter, ModelDrafterState, TreeModelDrafter
from specjax.draft.ngram import (BigramDrafter, NGramDrafter, NGramTreeDrafter, NoState,
                                 UnigramDrafter)
from specjax.draft.lookup_tree import PromptLookupTreeDrafter
from specjax.draft.prompt_lookup import PromptLookupDrafter
from specjax.draft.registry import DRAFTERS, drafter_fields, get_drafter, register_drafter
from specjax.draft.tree import DynamicTree, StaticTree, TreeProposal

__all__ = ["Drafter", "Accepted", "Proposal", "sample_guess", "ModelDrafter",
           "ModelDrafterState", "NGramDrafter", "UnigramDrafter", "BigramDrafter",
           "PromptLookupDrafter", "HierarchicalDrafter", "NoState", "StaticTree", "DynamicTree",
           "TreeModelDrafter", "TreeProposal", "PromptLookupTreeDrafter", "NGramTreeDrafter",
           "DRAFTERS", "get_drafter", "register_drafter", "drafter_fields", "DrafterDefaults", "FeatureDrafter",
           "FeatureDrafterState", "FeatureTreeDrafter"]
