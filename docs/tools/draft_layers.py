"""Does a second decoder layer help the EAGLE-3 draft? An A/B on the same batches: the committed one-layer draft
trained further, against the same draft with a second layer, on the committed corpus, online.

The second layer is what vLLM stacks after the first in its EAGLE-3 drafts: a plain Llama decoder layer over the
first layer's output h (input width H, not the first layer's 2H), with its own attention over the same positions,
read out by the same norm and LM head; its output is the state the next draft step reads. Its output projections
start at zero, so both arms start as the committed draft (step 0's figures are equal). Every step reads one batch
that the frozen base computes once for both arms (train.online's targets and states), each arm on its own AdamW at
the same lr schedule, and the held-out top-1 at distances 1-4 of both is written every --eval-every steps, with
each arm's training seconds (the base's forward left out; docs/tools/draft_ab.py). Not a decodable component: the
runtime drafts one layer.

    .venv/bin/python docs/tools/draft_layers.py --steps 240      # ~70 minutes on 2 cores
"""

import sys
from pathlib import Path

import torch
from torch import nn

from ppdkit.models.draft_heads import apply_linear
from ppdkit.models.eagle3 import rms_norm
from ppdkit.trainer.eagle3_run import Eagle3Run

sys.path.insert(0, str(Path(__file__).resolve().parent))  # draft_ab.py, beside this script
from draft_ab import ab_arguments, configure_logging, run_ab  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "measurements" / "draft-layers.json"
SECOND = "layer1."  # the second layer's tensor names: SECOND + a Llama decoder layer's


def add_second_layer(run: Eagle3Run, seed: int = 1) -> None:
    """The run's module gains a second layer that starts as the identity (zero output projections)."""
    w = run.module()
    h = w["fc.weight"].shape[0]
    q, kv = w["midlayer.self_attn.q_proj.weight"].shape[0], w["midlayer.self_attn.k_proj.weight"].shape[0]
    inner = w["midlayer.mlp.gate_proj.weight"].shape[0]
    gen = torch.Generator().manual_seed(seed)
    shapes = {"input_layernorm.weight": (h,), "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
              "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
              "post_attention_layernorm.weight": (h,), "mlp.gate_proj.weight": (inner, h),
              "mlp.up_proj.weight": (inner, h), "mlp.down_proj.weight": (h, inner)}
    for name, shape in shapes.items():
        if len(shape) == 1:
            value = torch.ones(shape)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            value = torch.zeros(shape)
        else:
            value = torch.randn(shape, generator=gen) * 0.02
        run.module.weights[(SECOND + name).replace(".", "__")] = nn.Parameter(value.to(run.device))


class TwoLayerRun(Eagle3Run):
    """Eagle3Run's training-time test with the second layer after the first at every step."""

    def _draft_step(self, w, x, hidden, kv, cos, sin, real):
        h0 = super()._draft_step(w, x, hidden, kv, cos, sin, real)  # [B, T, H] the first layer's
        x1 = rms_norm(h0, w[SECOND + "input_layernorm.weight"], self.eps)
        u = h0 + apply_linear(self._attended(w, x1, SECOND, kv[SECOND], cos, sin, real),
                              w[SECOND + "self_attn.o_proj.weight"])
        y = rms_norm(u, w[SECOND + "post_attention_layernorm.weight"], self.eps)
        gate, up = (apply_linear(y, w[SECOND + f"mlp.{m}_proj.weight"]) for m in ("gate", "up"))
        return u + apply_linear(nn.functional.silu(gate) * up, w[SECOND + "mlp.down_proj.weight"])


def main(argv: list[str] | None = None) -> int:
    a = ab_arguments(__doc__.splitlines()[0], OUT, 240).parse_args(argv)
    configure_logging()

    def prepare(name: str, run: Eagle3Run) -> None:
        if name == "two layers":
            run.__class__ = TwoLayerRun
            add_second_layer(run)
    run_ab(a, argv, "draft_layers.py", __doc__.splitlines()[0], {"one layer": {}, "two layers": {}}, prepare)
    return 0


if __name__ == "__main__":
    sys.exit(main())
