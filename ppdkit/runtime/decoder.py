"""The bundled decoder: `Decoder.from_pretrained(component)` then `generate(...)`, greedy or sampled, lossless.

This file holds what a loaded decoder is and does (`generate`, the methods it can run); what it drafts with is its one
`DraftParts` (drafters/draft_parts.py); decoder_loading.py builds one from a component or a base model."""

import ctypes
import gc
import logging
import threading
import time
from collections.abc import Callable

import torch

from . import decoder_loading
from .acceptance import Sampling
from .answer_tokens import AnswerTokens, GenerateResult
from .auto import AUTO, candidates, drop_trial, read_trial, run_trial
from .batching.drafting_choice import DraftingChoice
from .decoding_methods import METHODS, Need, get_method
from .drafters.draft_parts import DraftParts
from .forward.devices import on_device
from .forward.dtypes import GGUF
from .forward.fixed_shapes import ROWS as FIXED_ROWS
from .forward.gguf_blocks import QuantizedWeight
from .forward.llama import LeanLlama, end_tokens
from .generate_options import GenerateOptions, merged
from .kernels.openmp import release_openmp_threads
from .loop import decode
from .trees.profile_check import StepCheck
from .trees.tree_sizer import TreeSizer

log = logging.getLogger(__name__)


def _return_freed_memory() -> None:
    """Hand freed heap pages back to the system where the C library can (glibc's malloc_trim): without it the
    process keeps the freed weights' pages and its resident size does not show what it holds."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the pages return as the allocator decides
        pass


class Decoder:
    """One base model and the parts of one component it drafts with (`draft`). `generate` may be called from several
    threads: the calls take turns (a lock), each with its own KV cache, so their outputs are exactly those of calls
    made one by one.

    Everything runs on the device `hf_model` is on (from_pretrained/from_base move it there): the native
    kernels on a CPU, the PyTorch layers elsewhere, there in steps of one fixed shape (`fixed_shapes`, on by
    default off the CPU) so that tree methods stay lossless. Python reads only small results (tokens, accepted
    counts) from the device."""

    def __init__(self, hf_model, tokenizer, draft: DraftParts | None = None, max_length: int = 2048,
                 quantized: dict[str, QuantizedWeight] | None = None, weight_format: str = GGUF,
                 fixed_shapes: bool | None = None):
        self._lock = threading.Lock()  # one generate at a time: concurrent steps would only share 2 cores
        self.tokenizer = tokenizer
        self._hf_model = hf_model  # kept for the baselines and for divergence checks (hf_model)
        self._reload_hf: Callable[[], object] | None = None  # set by release_hf_model
        window = getattr(hf_model.config, "sliding_window", None)
        if window and getattr(hf_model.config, "use_sliding_window", True) and max_length > window:
            # the lean runtime attends to the whole context: within the window that is what the model does
            log.info("max_length %d capped at the model's sliding window of %d tokens", max_length, window)
            max_length = window
        # quantized: the matmuls' blocks of dtype gguf or q4 (weight_format)
        self.model = LeanLlama(hf_model, max_positions=max_length, quantized=quantized, weight_format=weight_format)
        self.device = self.model.device
        # steps of one shape (runtime/forward/fixed_shapes.py): by default wherever the PyTorch layers' library kernels
        # run a step, whose rows may differ by the step's size (a GPU); a CPU's native kernels need none
        self.fix_shapes(fixed_shapes)
        self.max_length = max_length
        self.draft = draft if draft is not None else DraftParts()  # the one component's parts
        self.fingerprint: str | None = None
        self.base_name: str | None = None  # the base model's catalog name or directory, where loaded by name
        self.profile: dict | None = None  # this machine's step latencies by tree size (runtime/trees/profile.py)
        self.unpaid: str | None = None  # why the profile-sized trees run as plain steps here (none of them pays)
        self.component_digest = "none"  # sha256 of the component's component.json: what auto's choice is for
        self._fastest: str | None = None  # auto's choice, once measured or read
        self._warned_unpaid: set[str] = set()  # the methods said once to run as ar (unpaid)
        # a grown tree's method -> whether its steps pay for drafting, as measured so far (GrownDrafter.choice)
        self.drafting_choices: dict[str, DraftingChoice] = {}
        self._trial: dict | None = None  # the trial it was chosen by (runtime/auto.py)
        # measures `profile` again where one was measured (runtime/decoder_loading.py sets it)
        self.measure_profile: Callable[[], None] | None = None
        # the live steps held to the cached timings they ran by: "profile", and auto's trial's step of each method
        self._checks: dict[str, StepCheck] = {}

    def fix_shapes(self, fixed: bool | None) -> None:
        """Steps of one shape (True), of their own (False), or by the device (None: fixed off the CPU)."""
        fixed = self.device.type not in ("cpu", "meta") if fixed is None else fixed
        self.model.fix_shapes(FIXED_ROWS if fixed else None)

    @property
    def hf_model(self):
        """transformers' model of the base weights (the bench's baselines), loaded again on first use after
        release_hf_model."""
        if self._hf_model is None:
            self._hf_model = self._reload_hf()
        return self._hf_model

    def release_hf_model(self, reload: Callable[[], object]) -> None:
        """Free transformers' copy of the weights where the runtime holds its own (the block formats: the runtime
        multiplies GGUF blocks and reads only the embeddings and norms, which it keeps); `reload` brings it back for
        a baseline that needs it."""
        self._hf_model, self._reload_hf = None, reload
        gc.collect()
        _return_freed_memory()

    # building one (runtime/decoder_loading.py): from a component directory or models:/ URI, or a base model alone
    from_pretrained = classmethod(decoder_loading.from_pretrained)
    from_base = classmethod(decoder_loading.from_base)

    def identity(self) -> str:
        """The base model and component (and skip map) this decoder runs: what a measured choice is valid for."""
        return f"{(self.fingerprint or 'unknown').split(':')[-1][:16]}-{self.component_digest[:16]}" \
               f"{self.draft.identity()}"

    def fastest_method(self, refresh: bool = False) -> str:
        """What `auto` runs here: the fastest method of this decoder in a short trial, measured once per machine
        (runtime/auto.py)."""
        if self._fastest is None or refresh:
            if candidates(self) == ["ar"]:
                self._fastest = "ar"
            else:
                self._trial = (None if refresh else read_trial(self)) or run_trial(self)
                self._fastest = self._trial["chosen"]
        return self._fastest

    def encode_chat(self, prompt: str) -> list[int]:
        return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                                  add_generation_prompt=True, return_dict=False)

    def generate(self, prompt: str | list[int], options: GenerateOptions | None = None, *,
                 stream: Callable[[list[int]], None] | None = None, should_stop: Callable[[], bool] | None = None,
                 **overrides) -> GenerateResult:
        """Decode `prompt` (text is wrapped in the chat template; ids are used as they are) as `options` ask
        (runtime/generate_options.py), with any option overridden by keyword: generate(prompt, max_new_tokens=64).

        `stream` receives each step's new tokens as they are verified; `should_stop`, asked after every step (after
        `stream`), ends the answer early when it returns True (a server's stop sequence found in the text, a client
        gone). Calls from several threads take turns."""
        options = merged(options, overrides)
        method = self.resolve_method(options.method)
        ids = self.fit_prompt(self.encode_chat(prompt) if isinstance(prompt, str) else list(prompt),
                              options.max_new_tokens, method, options.truncate)
        generator = torch.Generator(self.device).manual_seed(options.seed) if options.seed is not None else None
        with self._lock, torch.inference_mode(), on_device(self.device):
            try:
                return self._generate(torch.tensor(ids, dtype=torch.long), options.max_new_tokens, method, stream,
                                      options.sampling, generator, should_stop)
            finally:  # the next decode may run on another thread, whose workers must not find these awake
                release_openmp_threads()

    def resolve_method(self, name: str) -> str:
        """The method `name` runs as here (auto: the measured choice), or a clear error where this decoder's component
        does not carry what it needs."""
        method = self.fastest_method() if name == AUTO else name
        carried = self.carries()
        missing = [need.value for need in get_method(method).needs if need not in carried]
        if missing:
            raise ValueError(f"method {method} needs {' and '.join(missing)}, which this decoder's component does "
                             f"not carry; its methods: {', '.join(self.methods())}")
        if self.unpaid and {Need.TREES, Need.HEAD_TREE} & set(get_method(method).needs):
            if method not in self._warned_unpaid:
                self._warned_unpaid.add(method)
                log.warning("%s runs as ar here: %s", method, self.unpaid)
            return "ar"
        return method

    def fit_prompt(self, ids: list[int], max_new_tokens: int, method: str, truncate: str | None) -> list[int]:
        """The prompt's ids if they leave room for the answer within max_length, else its last ids that do
        (truncate="left"), else a clear error."""
        if truncate not in (None, "left"):
            raise ValueError(f"truncate must be None or 'left', not {truncate!r}")
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        if any(not 0 <= t < self.model.vocab_size for t in ids):
            raise ValueError(f"the prompt holds token ids outside the vocabulary (0..{self.model.vocab_size - 1})")
        # positions reach the prompt, the answer and one step's deepest row past its last token
        rows = self.step_rows(method)
        room = self.max_length - max_new_tokens - rows
        if len(ids) <= room:
            return ids
        if truncate == "left" and room >= 1:
            log.warning("the prompt has %d tokens; keeping its last %d so that %d new tokens fit in max_length=%d",
                        len(ids), room, max_new_tokens, self.max_length)
            return ids[-room:]
        raise ValueError(
            f"the prompt has {len(ids)} tokens, and {max_new_tokens} new tokens plus a decoding step of "
            f"{rows} need {len(ids) + max_new_tokens + rows} positions, more than "
            f"this decoder's max_length={self.max_length}. Load it with a larger max_length "
            "(Decoder.from_pretrained(..., max_length=N), within what the base model was trained for), ask for fewer "
            "new tokens, shorten the prompt, or pass truncate='left' to keep the prompt's last tokens")

    def _generate(self, ids: torch.Tensor, max_new_tokens: int, method: str,
                  stream: Callable[[list[int]], None] | None, sampling: Sampling,
                  generator: torch.Generator | None, should_stop: Callable[[], bool] | None = None) -> GenerateResult:
        started = time.perf_counter()
        answer = AnswerTokens(max_new_tokens, self.eos_ids(), stream, should_stop)
        sizer = self.draft.new_sizer(self.profile) if get_method(method).sized else None
        drafter = self.new_drafter(method, len(ids), max_new_tokens, sizer)
        pruned_rows = decode(drafter, ids, answer.add, sampling, generator)
        result = answer.result(self.tokenizer, method, self.step_rows(method), time.perf_counter() - started,
                               sizer.chosen if sizer is not None else [], pruned_rows)
        self._check_cached_timings(result)
        return result

    def _check_cached_timings(self, result: GenerateResult) -> None:
        """Hold an answer's steps to the cached timings they were chosen by, the latency profile and auto's trial
        (runtime/trees/profile_check.py), and measure again what they prove was measured on a busier machine."""
        if self.profile is not None and self.measure_profile is not None:
            check = self._checks.setdefault("profile", StepCheck.of_profile(self.profile))
            for rows, seconds in zip(result.rows_per_step, result.step_seconds):
                check.observe(rows, seconds["verify"])
            if check.stale():
                log.warning("the cached latency profile was measured on a busier machine: it priced one row at %.1f "
                            "ms, and %s; measuring it again", 1000 * check.predicted(1), check.describe())
                del self._checks["profile"]
                self.measure_profile()
        trial_step = (self._trial or {}).get("step_seconds", {}).get(result.method, 0.0)
        if trial_step > 0:
            check = self._checks.setdefault(result.method, StepCheck([1], [trial_step]))
            for seconds in result.step_totals():
                check.observe(1, seconds)
            if check.stale():
                log.warning("auto's cached trial was timed on a busier machine: it timed a step of %s at %.1f ms, and "
                            "%s; the next auto decode times the methods again", result.method, 1000 * trial_step,
                            check.describe())
                drop_trial(self)
                self._trial = self._fastest = None
                self._checks = {"profile": self._checks["profile"]} if "profile" in self._checks else {}

    def new_drafter(self, method: str, prompt_length: int, max_new_tokens: int, sizer: TreeSizer | None = None):
        """A fresh drafter of `method` (resolved) for one answer, over a cache that holds the prompt, the answer and
        one step's rows past its end."""
        cache = self.model.new_cache(prompt_length + max_new_tokens + 64 + self.step_rows(method))
        drafter = get_method(method).build(self, cache, sizer)
        if getattr(drafter, "choice", None) is not None:  # what drafting measured here carries over to later answers
            drafter.choice = self.drafting_choices.setdefault(method, drafter.choice)
        return drafter

    def carries(self) -> set[Need]:
        """What the loaded component provides, in the terms of runtime/decoding_methods.py's `needs`."""
        return self.draft.carries()

    def methods(self) -> list[str]:
        """The decoding methods this decoder can run."""
        return [name for name, m in METHODS.items() if set(m.needs) <= self.carries()]

    def step_rows(self, method: str) -> int:
        """The most rows one step of `method` feeds the model."""
        return self.draft.step_rows(get_method(method))

    def eos_ids(self) -> set[int]:
        """The token ids that end an answer (the model config's and the tokenizer's)."""
        return end_tokens(self.model, self.tokenizer)

