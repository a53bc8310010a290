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


def test_guess_ranks_read_the_guesses_through_the_custom_head(teacher_dir):
    """A zero custom decoding head is the identity: the same ranks as without it; a random one changes them."""
    from pathlib import Path

    from ppdkit.data_pipeline.teacher_cache import TeacherCache
    from ppdkit.models.artifact import Component
    from ppdkit.models.loading import load_base_model
    from ppdkit.trainer.calibrate import guess_ranks

    base = load_base_model("tiny-llama", quantization="none")
    g = torch.Generator().manual_seed(0)
    hidden = base.model.config.hidden_size
    tensors = {"prompt_embeddings": torch.randn(3, 1, hidden, generator=g)}
    hyper = {"num_prompt_tokens": 3, "num_epts": 1, "mask": "ensemble"}
    sequences = [s for s in TeacherCache(teacher_dir).sequences("train") if len(s.positions) > 1][:3]

    def ranks(extra: dict) -> torch.Tensor:
        component = Component(Path("."), "ept-head", hyper, {}, {}, {**tensors, **extra}, {})
        return guess_ranks(base.model, component, sequences, groups=4, micro_batch=2)

    plain = ranks({})
    assert (plain >= 0).any()
    assert torch.equal(ranks({"head_weight": torch.zeros(hidden, hidden), "head_bias": torch.zeros(hidden)}), plain)
    changed = ranks({"head_weight": torch.randn(hidden, hidden, generator=g), "head_bias": torch.randn(hidden, generator=g)})
    assert torch.equal(changed < 0, plain < 0) and not torch.equal(changed, plain)
