"""Online training: the frozen base computes a draft's targets and features in the training step.

SpecForge's online mode. No teacher cache is written: each sequence of the data stage is read by the frozen base
once, when a batch first needs it, and that one forward gives both
- the target: the base's own LM head on its final state at every supervised position, kept as its top-k
  log-probabilities and the mass outside them (exactly what the teacher stage would have stored), and
- the features the method reads: the final states (feature head, Medusa) or the residual stream after EAGLE-3's
  low, middle and high layers; none for the prompt tokens, which read the targets alone.
Results are kept in memory up to a budget, so later epochs skip the forward while they fit; past it they are
computed again at every visit. The cost is one base forward per sequence visit beyond the budget, against a
teacher stage that must finish (and be stored: ~17 GB of features for 4.8M positions) before training starts.

The forward runs on the decoder's runtime where its native kernels run (so targets and features are bit for bit
those of the model `ppdkit decode` verifies with), else through transformers.
"""

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from ppdkit.data_pipeline.teacher_cache import compress_head, compress_logits
from ppdkit.data_pipeline.templating import supervised_positions
from ppdkit.runtime.forward.layer_states import states_after
from ppdkit.runtime.forward.llama import LeanLlama

log = logging.getLogger(__name__)
ONLINE_KEEP_BYTES = 2e9  # a worker's kept targets and features: past it they are computed at every visit
RECENT = 64  # sequences kept past the budget, the latest read: more than a micro-batch holds


@dataclass
class _Computed:
    topk_ids: torch.Tensor  # [P, k] int32
    topk_logprobs: torch.Tensor  # [P, k] float16
    rest_mass: torch.Tensor  # [P] float32
    features: torch.Tensor | None  # [T, H] float16 or [T, n H] bfloat16, of the layer the method reads

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.topk_ids, self.topk_logprobs, self.rest_mass, self.features)
                   if t is not None)


class OnlineSequence:
    """A training sequence whose targets and features the frozen base computes when first read: it reads as the
    teacher cache's ShardSequence does (row, input_ids, positions, topk_ids, topk_logprobs, rest_mass, features)."""

    def __init__(self, teacher: "OnlineTeacher", split: str, row: int, input_ids: list[int], loss_mask: list[int]):
        self.teacher, self.split, self.row = teacher, split, row
        self.input_ids = torch.tensor(input_ids, dtype=torch.long)  # [T]
        self.positions = torch.tensor(supervised_positions(loss_mask), dtype=torch.long)  # [P]

    @property
    def features_layer(self):
        return self.teacher.layer

    def _computed(self) -> _Computed:
        return self.teacher.computed(self)

    @property
    def topk_ids(self) -> torch.Tensor:
        return self._computed().topk_ids

    @property
    def topk_logprobs(self) -> torch.Tensor:
        return self._computed().topk_logprobs

    @property
    def rest_mass(self) -> torch.Tensor:
        return self._computed().rest_mass

    @property
    def features(self) -> torch.Tensor | None:
        return self._computed().features


class OnlineTeacher:
    def __init__(self, base_model, top_k: int, keep_bytes: float):
        self.model, self.top_k, self.keep_bytes = base_model, top_k, keep_bytes
        runtime = LeanLlama(base_model) if next(base_model.parameters()).device.type == "cpu" else None
        self.runtime = runtime if runtime is not None and runtime.native is not None else None
        self.layer: int | tuple[int, ...] | None = None  # the features the method reads (FeatureCache's layer)
        self.wants_features = True  # False: targets alone (serve_targets_only)
        self._known: dict[tuple[str, int], _Computed] = {}
        self._recent: OrderedDict[tuple[str, int], _Computed] = OrderedDict()
        self.kept_bytes = 0
        self.forwards = 0  # base forwards run: what the positions/s figures pay for

    @property
    def engine(self) -> str:
        return "runtime" if self.runtime is not None else "transformers"

    def serve_features(self, layer: int | tuple[int, ...] | None) -> None:
        """The method's features (its FeatureCache's layer): computed in the same forward as the targets."""
        self.layer, self.wants_features = layer, True

    def serve_targets_only(self) -> None:
        """No features: the method (prompt tokens) reads the targets alone, so no states are kept beside them."""
        self.layer, self.wants_features = None, False

    def sequences(self, rows, split: str) -> list[OnlineSequence]:
        """The data stage's rows (input_ids, loss_mask) as sequences, numbered in order like a cache's."""
        return [OnlineSequence(self, split, i, r["input_ids"], r["loss_mask"]) for i, r in enumerate(rows)]

    def split(self, data_dir: Path, split: str) -> list[OnlineSequence]:
        """The sequences of a data stage's split (none where it has no such split) with targets at two positions at
        least, as a teacher cache's readers keep them."""
        if not (Path(data_dir) / split).exists():
            return []
        from datasets import load_from_disk

        rows = load_from_disk(str(Path(data_dir) / split))
        return [s for s in self.sequences(rows, split) if len(s.positions) > 1]

    def computed(self, seq: OnlineSequence) -> _Computed:
        key = (seq.split, seq.row)
        found = self._known.get(key) or self._recent.get(key)
        if found is None:
            found = self._forward(seq)
            self.forwards += 1
            self._keep(key, found)
        return found

    def _keep(self, key: tuple[str, int], found: _Computed) -> None:
        if self.kept_bytes + found.nbytes <= self.keep_bytes:
            self._known[key] = found
            self.kept_bytes += found.nbytes
        else:  # past the budget: kept for the rest of its batch only (a step reads a sequence's fields apart)
            self._recent[key] = found
            while len(self._recent) > RECENT:
                self._recent.popitem(last=False)

    def prefetch(self, seqs: list[OnlineSequence]) -> None:
        """Compute those of `seqs` not yet known in one padded forward through transformers (a GPU's engine): a step
        of 32 sequences then pays one call's overhead, not 32, which is where a GPU's time went. Padding goes on the
        right, after every real token, so under the causal mask no real token sees it: each sequence's results are
        its own forward's. On the runtime (a CPU) each sequence is still computed alone when first read."""
        todo = list({(s.split, s.row): s for s in seqs if (s.split, s.row) not in self._known
                     and (s.split, s.row) not in self._recent}.values())
        if self.runtime is not None or not todo:
            return
        ids = torch.zeros(len(todo), max(len(s.input_ids) for s in todo), dtype=torch.long)  # [B, T], 0 pads
        for i, s in enumerate(todo):
            ids[i, :len(s.input_ids)] = s.input_ids
        head = self.model.get_output_embeddings()
        with torch.no_grad():
            final, features = self._on_transformers(ids)  # [B, T, H], [B, T, F] or None
            for i, s in enumerate(todo):
                top, logprobs, rest = compress_logits(head(final[i, s.positions.to(final.device)]), self.top_k)
                kept = None if features is None else features[i, :len(s.input_ids)].clone()  # not the batch's storage
                self._keep((s.split, s.row), _Computed(top.to(torch.int32), logprobs.to(torch.float16), rest, kept))
        self.forwards += len(todo)

    def forget(self) -> None:
        """Drop every kept result (a benchmark's next mode computes them again)."""
        self._known.clear()
        self._recent.clear()
        self.kept_bytes = 0

    def _forward(self, seq: OnlineSequence) -> _Computed:
        with torch.no_grad():
            if self.runtime is not None:  # the LM head a block of rows at a time, as the teacher stage on it
                final, features = self._on_runtime(seq.input_ids)
                ids, logprobs, rest = compress_head(self.runtime.logits, final[seq.positions], self.top_k)
            else:
                final, features = self._on_transformers(seq.input_ids[None])
                final, features = final[0], None if features is None else features[0]
                head = self.model.get_output_embeddings()
                ids, logprobs, rest = compress_logits(head(final[seq.positions.to(final.device)]), self.top_k)
        return _Computed(ids.to(torch.int32), logprobs.to(torch.float16), rest, features)

    def _on_runtime(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(final states [T, H], the method's features): one pass through every layer, as `ar` reads a prompt."""
        rt = self.runtime
        layers = () if self.layer is None else (self.layer,) if isinstance(self.layer, int) else self.layer
        x, states = states_after(rt, rt.embed_ids(ids), torch.arange(len(ids)), rt.new_cache(len(ids)), None,
                                 (*layers, len(rt.layers)))
        final = rt.final_norm(x)
        if not self.wants_features:
            return final, None
        if self.layer is None:
            return final, final.to(torch.float16)
        width = states.shape[-1] // (len(layers) + 1)
        kept = states[:, :width * len(layers)]  # [T, n H]: the last block is the top layer's, asked for the head
        return final, kept.to(torch.float16 if isinstance(self.layer, int) else torch.bfloat16)

    def _on_transformers(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [B, T] -> (final states [B, T, H], the method's features [B, T, F])."""
        out = self.model.get_decoder()(input_ids=ids.to(self.model.device), output_hidden_states=self.layer is not None)
        final = out.last_hidden_state
        if not self.wants_features:
            return final, None
        if self.layer is None:
            return final, final.to(torch.float16)
        if isinstance(self.layer, int):
            return final, out.hidden_states[self.layer].to(torch.float16)
        return final, torch.cat([out.hidden_states[n] for n in self.layer], dim=-1).to(torch.bfloat16)


def prefetch(seqs: list) -> None:
    """A micro-batch's targets and features in one forward where train.online computes them on transformers (a
    GPU); a teacher cache's sequences, or the runtime's, are read as before."""
    if seqs and isinstance(seqs[0], OnlineSequence):
        seqs[0].teacher.prefetch(seqs)
