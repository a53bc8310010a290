"""docs/tools/draft_layers.py: the second layer of the A/B starts as the identity and then takes part."""

import random
import runpy
from pathlib import Path

import torch
from test_draft_heads import VOCAB

from ppdkit.data_pipeline.teacher_cache import ShardSequence
from ppdkit.models.loading import load_base_model
from ppdkit.trainer.config import TrainConfig
from ppdkit.trainer.training_methods import TRAINING_METHODS

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "tools" / "draft_layers.py"


def test_the_second_layer_starts_as_the_identity_and_then_changes_the_draft():
    tool = runpy.run_path(str(SCRIPT))
    base = load_base_model("tiny-llama", quantization="none", dtype="float32")
    ids = torch.tensor([random.Random(1).randrange(VOCAB) for _ in range(12)])
    g = torch.Generator().manual_seed(0)
    seq = ShardSequence(0, ids, torch.arange(11), torch.randint(0, VOCAB, (11, 4), generator=g),
                        torch.randn(11, 4, generator=g).log_softmax(-1), torch.zeros(11))
    cfg = TrainConfig(method="eagle3", head_depth=3, draft_vocab=VOCAB)
    one, two = (TRAINING_METHODS["eagle3"].start(cfg, base, [seq]) for _ in range(2))
    two.__class__ = tool["TwoLayerRun"]
    tool["add_second_layer"](two)
    assert len(two.module()) == len(one.module()) + 9  # a decoder layer's nine tensors
    with torch.no_grad():
        for (a, rows_a), (b, rows_b) in zip(one.unroll(one.module(), one.batch([seq], "train")),
                                            two.unroll(two.module(), two.batch([seq], "train"))):
            assert torch.equal(rows_a, rows_b) and torch.allclose(a, b, atol=1e-6)  # both are the one-layer draft
    loss, _ = two.loss(two.module, [seq], random.Random(0), 0)
    loss.backward()
    grads = {name: p.grad for name, p in two.module.weights.items() if name.startswith("layer1")}
    assert grads["layer1__self_attn__o_proj__weight"].abs().sum() > 0  # it learns from its zero start
    assert grads["layer1__mlp__down_proj__weight"].abs().sum() > 0
    with torch.no_grad():
        two.module.weights["layer1__mlp__down_proj__weight"].normal_(0, 0.1)
        changed = two.unroll(two.module(), two.batch([seq], "train"))[0][0]
        assert not torch.allclose(changed, one.unroll(one.module(), one.batch([seq], "train"))[0][0], atol=1e-4)
