"""`ppdkit precision`: what the runtime's bfloat16 (or gguf) weights cost against float32, measured on the same
prompts and texts in one process (runtime/forward/precision.py says what each dtype holds).

Two figures: how many greedy answers (`ar`) of the other decoder equal the float32 decoder's token for token,
and where the first differing token falls in those that do not; and the perplexity of held-out conversations,
teacher-forced, under each. Every drafter is lossless against `ar` in its own dtype (tests/test_precision.py,
tests/test_gguf_blocks.py), so these are the only differences a user of those weights sees.
"""

import json
import math
from datetime import datetime, timezone
from pathlib import Path

import torch
from tqdm import tqdm

from ppdkit.data_pipeline.readers import read_conversations
from ppdkit.runtime.decoder import Decoder
from .decoding import exact_dtype, first_difference, load_prompts, machine_info


def perplexity(decoder: Decoder, ids: list[int]) -> tuple[float, int]:
    """(summed negative log-likelihood, tokens predicted) of ids [T] teacher-forced, one forward over them."""
    model = decoder.model
    with torch.inference_mode():
        cache = model.new_cache(len(ids))
        hidden = model.forward(model.embed_ids(torch.tensor(ids)), torch.arange(len(ids)), cache, None)  # [T, H]
        logp = torch.log_softmax(model.logits(hidden[:-1]).float(), -1)  # [T-1, V]
        return float(-logp.gather(1, torch.tensor(ids[1:])[:, None]).sum()), len(ids) - 1


def run_precision(base: str, prompts_source: str, limit: int, max_new_tokens: int, texts_source: str,
                  texts_limit: int, text_tokens: int, dtypes: tuple[str, str] = ("float32", "bfloat16")) -> dict:
    """The report: per prompt whether the two dtypes' greedy answers are equal and where they first differ, and the
    held-out perplexity under each."""
    decoders = {dtype: exact_dtype(Decoder.from_base(base, dtype=dtype), dtype) for dtype in dict.fromkeys(dtypes)}
    reference, other = decoders[dtypes[0]], decoders[dtypes[1]]
    answers = []
    for prompt in tqdm(load_prompts(prompts_source, limit), desc="greedy answers", unit="prompt"):
        ids = reference.encode_chat(prompt)
        a, b = (d.generate(ids, max_new_tokens=max_new_tokens, method="ar").tokens for d in (reference, other))
        answers.append({"tokens": len(a), "equal": a == b, "first_difference": first_difference(a, b)})
    conversations, _ = read_conversations(texts_source, texts_limit, require_assistant=True)
    nll = dict.fromkeys(dtypes, 0.0)
    count = 0
    for conversation in tqdm(conversations, desc="held-out perplexity", unit="text"):
        ids = reference.tokenizer.apply_chat_template(list(conversation.messages), tokenize=True,
                                                      return_dict=False)[:text_tokens]
        if len(ids) < 2:
            continue
        for dtype, decoder in decoders.items():  # each distinct dtype once
            total, n = perplexity(decoder, ids)
            nll[dtype] += total
        count += n
    differing = sorted(a["first_difference"] for a in answers if not a["equal"])
    return {"base": base, "dtypes": list(dtypes), "prompts_source": prompts_source, "max_new_tokens": max_new_tokens,
            "answers": answers, "equal": sum(a["equal"] for a in answers), "prompts": len(answers),
            "first_difference_median": differing[len(differing) // 2] if differing else None,
            "first_difference_min": differing[0] if differing else None,
            "texts_source": texts_source, "texts": len(conversations), "text_tokens": count,
            "perplexity": {dtype: math.exp(nll[dtype] / max(count, 1)) for dtype in decoders},
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_info()}


def print_precision(report: dict) -> None:
    reference, other = report["dtypes"]
    print(f"{other} against {reference}, {report['base']}: {report['equal']} of {report['prompts']} greedy answers "
          f"({report['max_new_tokens']} tokens, {report['prompts_source']}) are the same token for token")
    if report["equal"] < report["prompts"]:
        print(f"  the others first differ at token {report['first_difference_min']} at the earliest, "
              f"{report['first_difference_median']} at the median")
    print(f"  held-out perplexity ({report['texts']} {report['texts_source']} conversations, {report['text_tokens']} "
          "tokens): " + ", ".join(f"{dtype} {value:.3f}" for dtype, value in report["perplexity"].items()))


def write_precision(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
