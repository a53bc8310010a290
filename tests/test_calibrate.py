import torch

from ppdkit.trainer.calibrate import acceptance_table


def test_acceptance_is_conditioned_on_nearer_distances_being_guessed():
    # ranks of the greedy token at distances 1, 2 for five insertions (-1: no target there)
    ranks = torch.tensor([[0, 0], [0, 1], [1, 0], [3, 0], [0, -1]])
    table = acceptance_table(ranks, max_rank=2)
    assert table[0] == [3 / 5, 1 / 5]  # all five count at distance 1
    # distance 2 counts the insertions whose distance-1 token was within the 2 ranks and that have a target:
    # rows 0, 1, 2 (row 3 missed at distance 1, row 4 has no distance-2 target)
    assert table[1] == [2 / 3, 1 / 3]
