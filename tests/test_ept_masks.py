"""EPT attention masks (PPD thesis section 4.4.3) against hand-written cases: k=2 prompt tokens, n=2 EPTs.

Layout order: (d1,e1) (d1,e2) (d2,e1) (d2,e2); row attends to column where 1.
"""

import pytest
import torch

from ppdkit.models.prompt_tokens import PromptTokens, aggregate_epts, ept_mask

ENSEMBLE = [[1, 0, 0, 0],
            [0, 1, 0, 0],
            [1, 0, 1, 0],
            [0, 1, 0, 1]]
DECODER = [[1, 0, 0, 0],
           [1, 1, 0, 0],
           [1, 1, 1, 0],
           [1, 1, 1, 1]]
ENCODER = [[1, 1, 0, 0],
           [1, 1, 0, 0],
           [1, 1, 1, 1],
           [1, 1, 1, 1]]


@pytest.mark.parametrize("kind,expected", [("ensemble", ENSEMBLE), ("decoder", DECODER), ("encoder", ENCODER)])
def test_masks_by_hand(kind, expected):
    assert ept_mask(2, 2, kind).int().tolist() == expected


def test_with_one_ept_every_mask_is_causal():
    for kind in ("ensemble", "decoder", "encoder"):
        assert torch.equal(ept_mask(3, 1, kind), torch.ones(3, 3, dtype=torch.bool).tril())


def test_ensemble_of_three_groups():
    m = ept_mask(3, 3, "ensemble")
    # EPT 2 of distance 3 (index 2*3+1 = 7) sees EPT 2 of distances 1, 2, 3: indices 1, 4, 7.
    assert m[7].nonzero().flatten().tolist() == [1, 4, 7]


def test_unknown_mask_is_refused():
    with pytest.raises(ValueError, match="ensemble, decoder or encoder"):
        ept_mask(2, 2, "sideways")


def test_aggregation_mean_and_learned():
    x = torch.arange(2 * 3 * 4, dtype=torch.float).reshape(2 * 3, 4)  # k=2, n=3, D=4
    assert torch.allclose(aggregate_epts(x, 2, 3, None), x.reshape(2, 3, 4).mean(1))
    w = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    assert torch.allclose(aggregate_epts(x, 2, 3, w), torch.stack([x[0], 2 * x[5]]))
    module = PromptTokens(2, 3, 4, aggregation="learned")
    emb, weights = module()
    assert emb.shape == (6, 4) and weights.shape == (2, 3)
