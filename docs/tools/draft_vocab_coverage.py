"""How much of what the base model writes a draft vocabulary can propose at all.

A draft with a reduced vocabulary (train.draft_vocab: EAGLE-3, the heads, the early head) never proposes a token
outside it, so the share of the base model's own tokens inside it caps every distance's acceptance. For vocabularies
of the N most frequent tokens of a teacher cache's training sequences (what training picks: ppdkit/models/draft_heads.py
frequent_tokens), this prints and writes the share of the base model's greedy tokens (`ar`, bfloat16) inside, by N,
on MT-Bench first turns, HumanEval and the data set's own held-out first turns; and, for the component's own
vocabulary, how many of the tokens outside it appeared earlier in the prompt or the answer (those an n-gram chain of
the live text, as eagle3-anpd merges, can still propose).

    python docs/tools/draft_vocab_coverage.py --model ppdkit/models/components/smollm2-135m-eagle3 \\
        --run <cache>/runs/smollm2-draft-data --write-prompts held-out.jsonl
    ppdkit bench --model ppdkit/models/components/smollm2-135m-eagle3 --prompts held-out.jsonl --methods ar,eagle3 \\
        --tree-size 16
"""

import argparse
import json
from datetime import datetime, timezone
from pathlib import Path

import datasets
import torch

from ppdkit.data_pipeline.teacher_cache import TeacherCache
from ppdkit.bench.decoding import load_prompts, machine_info
from ppdkit.models.artifact import ArtifactError, read_component
from ppdkit.models.draft_heads import frequent_tokens, inverse_index
from ppdkit.runtime.decoder import Decoder

SIZES = (2048, 4096, 8192, 16384, 32768)
OUT = Path(__file__).resolve().parents[1] / "measurements" / "draft-vocab-coverage.json"


def held_out_first_turns(data_dir: Path, limit: int) -> list[str]:
    """The first user turns of a data stage's held-out conversations (never trained on)."""
    turns = []
    for row in datasets.load_from_disk(str(data_dir / "holdout")):
        first = next((m["content"] for m in json.loads(row["messages"]) if m.get("role") == "user"), None)
        if first:
            turns.append(first)
        if len(turns) == limit:
            break
    return turns


def coverage(decoder: Decoder, prompts: list[str], new_tokens: int, vocabularies: dict[int, torch.Tensor],
             own: torch.Tensor) -> dict:
    """The greedy answers' share of tokens inside each vocabulary (token id masks [V]); of those outside `own`, the
    share seen earlier in the context."""
    tokens, outside, earlier = [], 0, 0
    for prompt in prompts:
        ids = decoder.encode_chat(prompt)
        seen = set(ids)
        for token in decoder.generate(ids, new_tokens, "ar").tokens:
            tokens.append(token)
            if not own[token]:
                outside, earlier = outside + 1, earlier + (token in seen)
            seen.add(token)
    answer = torch.tensor(tokens)
    return {"tokens": len(tokens), "inside_by_size": {n: round(float(mask[answer].float().mean()), 4)
                                                      for n, mask in vocabularies.items()},
            "inside_own": round(1 - outside / len(tokens), 4),
            "outside_own_seen_earlier": round(earlier / max(outside, 1), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a component with a draft vocabulary")
    parser.add_argument("--run", required=True, type=Path, help="the output of the data and teacher stages")
    parser.add_argument("--limit", type=int, default=10, help="prompts per set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--write-prompts", type=Path, help="also write the held-out first turns here as JSONL, for "
                        "`ppdkit bench --prompts FILE`")
    args = parser.parse_args()

    decoder = Decoder.from_pretrained(args.model, dtype="bfloat16")
    vocab_size = decoder.model.vocab_size
    own_ids = read_component(Path(args.model)).tensors.get("draft_vocab")
    if own_ids is None:
        raise ArtifactError(f"{args.model} has no draft vocabulary (a component of train.draft_vocab's methods has)")
    cache = TeacherCache(args.run / "teacher")
    sequences = [s.input_ids for s in cache.sequences("train")]

    vocabularies = {n: inverse_index(frequent_tokens(sequences, n, vocab_size), vocab_size) >= 0 for n in SIZES}
    own = inverse_index(own_ids.long(), vocab_size) >= 0
    sets = {"mt-bench": load_prompts("mt-bench", args.limit), "humaneval": load_prompts("humaneval", args.limit),
            "held-out": held_out_first_turns(args.run / "data", args.limit)}
    report = {"model": str(args.model), "draft_vocab": len(own_ids), "training_sequences": len(sequences),
              "new_tokens": args.max_new_tokens, "machine": machine_info(),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "sets": {name: coverage(decoder, prompts, args.max_new_tokens, vocabularies, own)
                       for name, prompts in sets.items()}}
    if args.write_prompts:
        args.write_prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in sets["held-out"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print("share of the base model's greedy tokens inside the N most frequent training tokens")
    print("set        " + " ".join(f"{n:>7}" for n in SIZES) + "    own  outside, seen earlier")
    for name, row in report["sets"].items():
        print(f"{name:<10} " + " ".join(f"{row['inside_by_size'][n]:>7.3f}" for n in SIZES)
              + f"  {row['inside_own']:.3f}  {row['outside_own_seen_earlier']:.3f}")


if __name__ == "__main__":
    main()
