"""Self-distillation data: the base model rewrites every assistant turn from the user turns before it.

When the training text was written by another model, the prompt tokens would learn to guess text the
base model would never produce. Regenerating the assistant turns (Medusa-2, PPD) makes the training
text the model's own. Conversations are advanced turn by turn, in batches, with left padding.
"""

from dataclasses import dataclass, field

import torch

from .conversations import Conversation


@dataclass
class _Progress:
    conv: Conversation
    next_index: int = 0
    messages: list[dict] = field(default_factory=list)
    done: bool = False


def _advance(state: _Progress, tokenizer, max_length: int) -> bool:
    """Copy turns up to the next assistant turn; True if one is waiting to be generated."""
    msgs = state.conv.messages
    while state.next_index < len(msgs) and (msgs[state.next_index]["role"] != "assistant" or not state.messages):
        if msgs[state.next_index]["role"] != "assistant":
            state.messages.append(dict(msgs[state.next_index]))
        # else: an assistant turn with nothing before it (ShareGPT has some) has no prompt to answer: dropped
        state.next_index += 1
    if state.next_index >= len(msgs):
        state.done = True
        return False
    prompt_len = len(tokenizer.apply_chat_template(state.messages, tokenize=True, add_generation_prompt=True,
                                                   return_dict=False))
    if prompt_len >= max_length:  # later turns would be cut by max_length anyway
        state.done = True
        return False
    return True


def regenerate_conversations(model, tokenizer, conversations: list[Conversation], *, max_new_tokens: int,
                             max_length: int, temperature: float, seed: int, batch_size: int) -> list[Conversation]:
    """Each conversation with its assistant turns replaced by the model's own (greedy when temperature == 0)."""
    states = [_Progress(c) for c in conversations]
    generator_seed = seed
    pad_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        while True:
            waiting = [s for s in states if not s.done and _advance(s, tokenizer, max_length)]
            if not waiting:
                break
            for i in range(0, len(waiting), batch_size):
                batch = waiting[i:i + batch_size]
                prompts = [tokenizer.apply_chat_template(s.messages, tokenize=False, add_generation_prompt=True)
                           for s in batch]
                enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
                torch.manual_seed(generator_seed)
                generator_seed += 1
                with torch.inference_mode():
                    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                                         temperature=temperature if temperature > 0 else None, top_p=None, top_k=None,
                                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
                for state, new in zip(batch, out[:, enc["input_ids"].shape[1]:]):
                    text = tokenizer.decode(new, skip_special_tokens=True)
                    state.messages.append({"role": "assistant", "content": text})
                    state.next_index += 1
    finally:
        tokenizer.padding_side = pad_side
    return [Conversation(s.conv.id, tuple(s.messages)) for s in states]
