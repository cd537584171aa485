"""Drafters: who guesses the γ tokens that the target verifies.

A drafter is hashable configuration plus params and a per-generation state
(`Drafter` protocol); `propose` returns a `Proposal` (guesses, their q, calls).
"""
from specjax.draft.base import Drafter, Proposal, sample_guess
from specjax.draft.hierarchical import HierarchicalDrafter
from specjax.draft.model import ModelDrafter, ModelDrafterState
from specjax.draft.ngram import BigramDrafter, NGramDrafter, NoState, UnigramDrafter
from specjax.draft.lookup_tree import PromptLookupTreeDrafter
from specjax.draft.ngram_tree import NGramTreeDrafter
from specjax.draft.prompt_lookup import PromptLookupDrafter
from specjax.draft.tree import DynamicTree, StaticTree, TreeModelDrafter, TreeProposal

__all__ = ["Drafter", "Proposal", "sample_guess", "ModelDrafter", "ModelDrafterState",
           "NGramDrafter", "UnigramDrafter", "BigramDrafter", "PromptLookupDrafter",
           "HierarchicalDrafter", "NoState", "StaticTree", "DynamicTree",
           "TreeModelDrafter", "TreeProposal", "PromptLookupTreeDrafter", "NGramTreeDrafter"]
