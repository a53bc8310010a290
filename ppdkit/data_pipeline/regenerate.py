"""Self-distillation data: the base model rewrites every assistant turn from the user turns before it.

When the training text was written by another model, the prompt tokens would learn to guess text the
base model would never produce. Regenerating the assistant turns (Medusa-2, PPD) makes the training
text the model's own. Every assistant turn that still fits max_length is rewritten, in order (a later
turn answers the user's next message after the model's own earlier answer).

Two engines:
- the runtime (`runtime` given): continuous batching on the decoder's own model and kernels
  (runtime/batching/batched_decoding.py), a conversation's next turn queued first as soon as its previous one ends (it
  reads only its new user turn, the rest is in the segment its previous turn left); every answer is
  token for token what `ppdkit decode --method ar` gives in the same dtype, whatever its batch neighbours, and
  a turn stops at the end token or where the conversation reaches max_length (tokens past it would be cut).
  Sampled (temperature > 0), each turn draws with a seed of its own (`turn_seed`: the run's seed, the
  conversation and the turn), so it is `ppdkit decode --method ar --temperature T --seed turn_seed(...)`'s answer:
  a second set drawn with another seed gives other answers to the same prompts, and a rerun the same ones;
- transformers' generate in fixed batches with left padding, for models the native kernels cannot run. Its rows
  may depend on their batch neighbours (padding, library kernels that change with the batch), so it is not
  reproducible across batch sizes.

A user turn marked `write` (data.source magpie, or a file's {"role": "user", "write": true}) is written by the model
itself first, Magpie's way (Xu et al. 2024): the chat template up to where a user's text would start, continued at
`prompt_temperature` until the end-of-turn token. An instruction-tuned model then asks what its own fine-tuning data
asked, so prompts come in any number, in the model's own distribution, not only from the sets at hand. Drawn on the
runtime, each is `ar`'s sample from that prefix with a seed of its own (`turn_seed` of the user turn).
"""

import hashlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ppdkit.models.config import BaseModelConfig
from ppdkit.models.device_plan import DevicePlan, current_device_plan
from ppdkit.models.loading import load_base_model
from ppdkit.runtime.batching.batched_decoding import Request, decode_many
from ppdkit.runtime.forward.llama import LeanLlama, end_tokens

from .config import PROMPT_TEMPERATURE
from .conversations import Conversation, steers, to_write
from .templating import user_turn_prefix


@dataclass
class _Progress:
    conv: Conversation
    next_index: int = 0
    messages: list[dict] = field(default_factory=list)
    done: bool = False
    writing_prompt: bool = False  # the turn waiting to be generated is a user turn marked `write`, not an answer


def _model_writes(message: dict, before: list[dict]) -> bool:
    """Whether the model writes `message`: an assistant turn with something before it to answer, or a user turn
    marked `write`."""
    return to_write(message) or (message["role"] == "assistant" and bool(before))


def _advance(state: _Progress, tokenizer, max_length: int) -> list[int] | None:
    """Copy turns up to the next one the model writes; the ids it continues if one is waiting, else None."""
    msgs = state.conv.messages
    while state.next_index < len(msgs) and not _model_writes(msgs[state.next_index], state.messages):
        if msgs[state.next_index]["role"] != "assistant":
            state.messages.append(dict(msgs[state.next_index]))
        # else: an assistant turn with nothing before it (ShareGPT has some) has no prompt to answer: dropped
        state.next_index += 1
    if state.next_index >= len(msgs):
        state.done = True
        return None
    state.writing_prompt = to_write(msgs[state.next_index])
    ids = (tokenizer(user_turn_prefix(tokenizer, state.messages), add_special_tokens=False)["input_ids"]
           if state.writing_prompt else
           tokenizer.apply_chat_template(_answered_to(state.messages), tokenize=True, add_generation_prompt=True,
                                         return_dict=False))
    if len(ids) >= max_length:  # later turns would be cut by max_length anyway
        state.done = True
        return None
    return ids


def _answered_to(messages: list[dict]) -> list[dict]:
    """What an answer is written to, and what the conversation keeps: the turns without steering prompts."""
    return [m for m in messages if not steers(m)]


def _answered(state: _Progress, text: str) -> None:
    """Record the turn the model wrote. A written prompt that is empty ends the conversation there (nothing to
    answer; the teacher stage skips a conversation left with no turn at all)."""
    state.next_index += 1
    if not state.writing_prompt:
        state.messages.append({"role": "assistant", "content": text})
    elif text.strip():
        state.messages.append({"role": "user", "content": text.strip()})
    else:
        state.done = True


def _waiting_turn(state: _Progress) -> tuple[str, int]:
    """The role of the turn waiting to be written and its number among that role's turns (from 0): what seeds it."""
    role = "user" if state.writing_prompt else "assistant"
    return role, sum(m["role"] == role for m in state.messages)


def regenerate_conversations(model, tokenizer, conversations: list[Conversation], *, max_new_tokens: int,
                             max_length: int, temperature: float, seed: int, batch_size: int,
                             runtime: LeanLlama | None = None, prompt_temperature: float = PROMPT_TEMPERATURE,
                             on_tokens: Callable[[int], None] | None = None) -> list[Conversation]:
    """Each conversation with its assistant turns replaced by the model's own (greedy when temperature == 0) and
    its user turns marked `write` written by it (at `prompt_temperature`): on `runtime` with `batch_size` slots when
    given, else through `model.generate`. `on_tokens(n)` is told of every n tokens generated."""
    if runtime is not None:
        return _regenerate_batched(runtime, tokenizer, conversations, max_new_tokens, max_length, batch_size, on_tokens,
                                   temperature, seed, prompt_temperature)
    states = [_Progress(c) for c in conversations]
    generator_seed = seed
    pad_side, pad = tokenizer.padding_side, tokenizer.pad_token
    tokenizer.padding_side = "left"
    if pad is None:  # a batch needs one (SmolLM2's tokenizer names none): end-of-text pads, left of each prompt
        tokenizer.pad_token = tokenizer.eos_token
    try:
        while True:
            waiting = [s for s in states if not s.done and _advance(s, tokenizer, max_length) is not None]
            if not waiting:
                break
            # prompts and answers in batches of their own: each batch draws at one temperature
            kinds = ([s for s in waiting if s.writing_prompt], [s for s in waiting if not s.writing_prompt])
            for batch in (kind[i:i + batch_size] for kind in kinds for i in range(0, len(kind), batch_size)):
                heat = prompt_temperature if batch[0].writing_prompt else temperature
                prompts = [user_turn_prefix(tokenizer, s.messages) if s.writing_prompt else
                           tokenizer.apply_chat_template(_answered_to(s.messages), tokenize=False,
                                                         add_generation_prompt=True)
                           for s in batch]
                enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
                torch.manual_seed(generator_seed)
                generator_seed += 1
                with torch.inference_mode():
                    out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=heat > 0,
                                         temperature=heat if heat > 0 else None, top_p=None, top_k=None,
                                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
                new_tokens = out[:, enc["input_ids"].shape[1]:]
                for state, new in zip(batch, new_tokens):
                    _answered(state, tokenizer.decode(new, skip_special_tokens=True))
                if on_tokens:
                    on_tokens(int((new_tokens != tokenizer.pad_token_id).sum()))
    finally:
        tokenizer.padding_side, tokenizer.pad_token = pad_side, pad
    return [Conversation(s.conv.id, tuple(_answered_to(s.messages))) for s in states]


def turn_seed(seed: int, conversation: str, turn: int, role: str = "assistant") -> int:
    """The generator seed of a conversation's `turn`-th answer (from 0), or with role "user" its `turn`-th written
    prompt, in a regeneration seeded `seed`: independent of which worker, shard or batch the conversation lands in."""
    key = f"{seed}/{conversation}/{turn}" if role == "assistant" else f"{seed}/{conversation}/{role}/{turn}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "big")


def _regenerate_batched(runtime: LeanLlama, tokenizer, conversations: list[Conversation], max_new_tokens: int,
                        max_length: int, slots: int, on_tokens: Callable[[int], None] | None,
                        temperature: float, seed: int, prompt_temperature: float) -> list[Conversation]:
    states = [_Progress(c) for c in conversations]
    waiting = deque((i, ids) for i, s in enumerate(states) if (ids := _advance(s, tokenizer, max_length)) is not None)

    def next_request() -> Request | None:
        if not waiting:
            return None
        i, ids = waiting.popleft()
        state = states[i]
        role, turn = _waiting_turn(state)
        return Request(i, ids, min(max_new_tokens, max_length - len(ids)), turn_seed(seed, state.conv.id, turn, role),
                       prompt_temperature if state.writing_prompt else None)

    with torch.inference_mode():
        for request, tokens in decode_many(runtime, next_request, end_tokens(runtime, tokenizer), slots, max_length,
                                           on_tokens=on_tokens, temperature=temperature):
            state = states[request.key]
            _answered(state, tokenizer.decode(tokens, skip_special_tokens=True))
            if (ids := _advance(state, tokenizer, max_length)) is not None:  # first in line: while the segment
                waiting.appendleft((request.key, ids))  # of its previous turn is free, it reads only the new turn
    return [Conversation(s.conv.id, tuple(_answered_to(s.messages))) for s in states]


def regeneration_runtime(loaded, base: BaseModelConfig, dtype: str, max_length: int,
                         plan: DevicePlan | None = None) -> LeanLlama | None:
    """The model greedy regeneration decodes on, and an unquantized teacher's pass reads with: the decoder's own
    (runtime/forward/llama.py on the unquantized base in `dtype`, what `ppdkit decode` verifies with), so the
    regenerated text is what the decoder would write. A 4-bit teacher loads that model beside it. None where the native
    kernels cannot run it (transformers' generate and forward then), and where the device plan (default: this
    process's) regenerates on the GPU the teacher was loaded on: transformers' generate in batches there, not an
    unquantized copy on the CPU."""
    plan = plan or current_device_plan()
    if plan.regeneration_engine == "transformers" and next(loaded.model.parameters()).device.type == plan.device:
        return None
    model = loaded.model if base.quantization == "none" else load_base_model(base.name, "none", dtype).model
    if next(model.parameters()).device.type != "cpu":
        return None
    runtime = LeanLlama(model, max_length + 1)
    return runtime if runtime.native is not None else None
