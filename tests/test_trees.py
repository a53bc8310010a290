"""Dynamic sparse tree construction against small hand-computed cases."""

import pytest

from ppdkit.runtime.trees.tree import (allocate_prompts, best_tree_for_size, build_dynamic_tree, candidate_tree,
                                 final_probabilities, steady_state)


def test_candidate_tree_takes_the_most_probable_paths():
    p = [[0.6, 0.3], [0.5, 0.2]]
    parents, depths, ranks, probs = candidate_tree(p, max_depth=2, n=3)
    # paths: d1r0 0.6, d1r1 0.3, d1r0->d2r0 0.30, d1r0->d2r1 0.12, d1r1->d2r0 0.15
    assert parents == [-1, 0, 0, 1] or parents == [-1, 0, 1, 0]
    assert sorted(probs[1:], reverse=True) == pytest.approx([0.6, 0.3, 0.3])
    assert candidate_tree(p, max_depth=1, n=5)[1] == [0, 1, 1]  # depth capped: only the two depth-1 guesses


def test_final_probabilities_partition_the_outcomes():
    p = [[0.6, 0.3], [0.5, 0.2]]
    tree = candidate_tree(p, 2, 4)
    final = final_probabilities(*tree, p)
    assert sum(final) == pytest.approx(1.0)
    assert final[0] == pytest.approx(1 - 0.6 - 0.3)  # the root is final when no depth-1 guess is right


def test_prompt_allocation_removes_where_it_costs_least():
    # f by state: one distance is worth 0.5 tokens, a second adds 0.1: removing a second prompt token
    # costs p_final * 0.1, so it goes first from the node least likely to be final.
    prompts = allocate_prompts(final=[0.2, 0.8], f_by_state={0: 0.0, 1: 0.5, 2: 0.6}, m=2, n_prompts=3)
    assert prompts == [1, 2]


def test_two_state_chain_steady_state():
    pi = steady_state({1: {1: 0.5, 2: 0.5}, 2: {1: 1.0}})
    assert pi[1] == pytest.approx(2 / 3) and pi[2] == pytest.approx(1 / 3)


def test_tau_of_the_smallest_tree_by_hand():
    # one prompt token, guesses right half the time: one guess node, each step yields 1 + 0.5 tokens
    tree = build_dynamic_tree([[0.5]], n_candidates=1, n_prompts=2)
    assert tree.tau == pytest.approx(1.5)
    assert tree.states[1].prompts == (1, 1)


def test_bigger_budgets_never_hurt():
    p = [[0.5, 0.2, 0.1], [0.3, 0.1, 0.05], [0.2, 0.1]]
    taus = [best_tree_for_size(p, size).tau for size in (4, 8, 16, 32, 48)]
    assert all(b >= a - 1e-9 for a, b in zip(taus, taus[1:]))
    assert all(best_tree_for_size(p, s).size <= s for s in (4, 8, 16, 32))
