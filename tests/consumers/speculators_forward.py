"""Run by tests/test_eagle3_export.py in the speculators venv (`make setup-speculators`), not in ppdkit's: load an
exported eagle3 draft with speculators' own loader, run one draft step (no training-time test) on the given
inputs, and write what it computed.

    python speculators_forward.py DRAFT_DIR INPUTS.safetensors OUT.safetensors

INPUTS holds aux [T, 3H] (the base's hidden states, before fc), ids [T] (the token paired with each row) and
positions [T]; OUT gets the draft's pre-norm states h [T, H], its logits [T, V'] and its d2t [V'].
"""

import sys

import torch
from safetensors.torch import load_file, save_file
from speculators.models.eagle3 import Eagle3DraftModel

draft_dir, inputs, out = sys.argv[1:4]
model = Eagle3DraftModel.from_pretrained(draft_dir).eval()
x = load_file(inputs)
seen = {}
# forward returns only the drafted ids: its states and logits are read where the readout takes and gives them
model.norm.register_forward_pre_hook(lambda module, args: seen.__setitem__("h", args[0].detach().clone()))
model.lm_head.register_forward_hook(lambda module, args, output: seen.__setitem__("logits", output.detach().clone()))
with torch.no_grad():
    model(hidden_states=x["aux"][None], input_ids=x["ids"][None], document_ids=torch.zeros_like(x["ids"])[None],
          position_ids=x["positions"][None], ttt_steps=1)
save_file({"h": seen["h"][0].float().contiguous(), "logits": seen["logits"][0].float().contiguous(),
           "d2t": model.d2t.contiguous()}, out)
