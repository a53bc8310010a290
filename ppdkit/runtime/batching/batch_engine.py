"""Continuous batching of whole answers with their drafts: `ppdkit serve`'s decoder for many clients at once.

Answers join and leave at every step. Each brings its own method's drafter (runtime/drafters/drafter.py) and runs the
one decode loop (runtime/loop.py steps); one forward per step verifies every answer's proposal
(runtime/batching/batched_verify.py), so the base model's weights are read once for all of them, and each answer is
token for token what `Decoder.generate` gives it alone (greedy; sampled with its seed): its rows' arithmetic is that of
its step decoded alone, whoever shares the step. A vLLM-style batch promises no such thing.

How many rows an answer's step carries is chosen by what rows cost. A step costs about b0 + b1 * rows (a line fitted
to the engine's own steps, seeded by the decoder's profile): b0 reads the weights, shared by every answer in the
step, and each row adds b1. A grown tree (eagle3*, feature-grown*) sizes itself against its share of that line, b0 /
answers + b1 * its rows: alone it weighs rows against the whole b0 as `generate` does, among many it keeps only
guesses likely enough to pay a row's full cost. Whether the trees draft at all is chosen by the tokens per second each
choice measured at this many answers (runtime/batching/drafting_choice.py): at high load the root alone, `ar` inside the
batch, comes to pay. Rows per step are capped so that all answers fit one forward of the native kernels
(SKINNY_MAX_ROWS). Methods whose drafts run the base model outside the verification (skip, skip-ft) or prune it part-way
(*-prune) cannot share a step: such an answer decodes alone, between two steps of the batch.

Every answer's keys/values live in its own range of one shared cache (runtime/batching/slot_ranges.py), as long as its
prompt, its answer and one step; a prompt is read alone into a scratch cache, exactly as `generate` reads it, and copied
in. An answer alone in the engine stays in the scratch cache, its steps verified as `generate` verifies them, until
another answer's prompt needs the scratch: then it moves into its range and shares the steps. The engine runs in a
thread of its own, the only one that decodes (runtime/kernels/openmp.py says why that matters); it hands its OpenMP
workers back whenever it has nothing to decode.
"""

import collections
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from ..answer_tokens import AnswerTokens, GenerateResult
from ..auto import AUTO
from ..decoding_methods import GROWN_NODES, get_method
from ..drafters.drafter import Drafter, Proposal, Verified, verify
from ..forward.devices import on_device
from ..forward.kv_cache import CacheSegment
from ..forward.linear import SKINNY_MAX_ROWS
from ..generate_options import GenerateOptions, merged
from ..kernels.openmp import release_openmp_threads
from ..loop import next_proposal, steps
from ..trees.grown_tree import GrownDrafter, latency_model
from .batched_verify import Step, verify_steps
from .drafting_choice import DraftingChoice
from .slot_ranges import SlotRanges

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Answer:
    """One submitted answer: what was asked, and once admitted its drafter, loop, segment and current proposal."""

    ids: list[int]
    options: GenerateOptions
    tokens: AnswerTokens
    future: Future = field(default_factory=Future)
    method: str = ""
    started: float = 0.0
    width: int = 0  # its slots in the shared cache
    segment: CacheSegment | None = None
    drafter: Drafter | None = None
    loop: object = None  # its runtime/loop.py steps generator
    proposal: Proposal | None = None
    generator: torch.Generator | None = None
    sizer: object = None
    alone: bool = False  # its keys/values still in the scratch cache, verified as `generate` verifies (_step)


class StepShare:
    """A grown tree's view of a shared step's cost (GrownDrafter.latency): the step's fixed part split among the
    answers that share it, each of its own rows at a row's full cost. The engine observes whole steps."""

    def __init__(self, engine: "BatchEngine"):
        self.engine = engine

    def coefficients(self) -> tuple[float, float]:
        b0, b1 = self.engine.latency.coefficients()  # a line fitted to noisy times: its intercept may come out <= 0
        return max(b0, 1e-6) / max(len(self.engine.active), 1), b1

    def observe(self, rows: int, seconds: float) -> None:
        """Nothing: one answer's rows are not what a shared step's time depends on."""


class BatchEngine:
    """`submit` answers of one Decoder; they are decoded together, at most `max_batch` at once, in a cache of
    `cache_positions` slots in all (default: room for `max_batch` answers of the decoder's max_length, up to about
    2 GB of keys and values). `max_rows` caps a step's rows (one native forward)."""

    def __init__(self, decoder, max_batch: int = 64, cache_positions: int | None = None,
                 max_rows: int = SKINNY_MAX_ROWS):
        if decoder.model.native is None:
            raise ValueError("batched decoding runs on the native CPU kernels, which this decoder does not use "
                             "(another device, a model with biases, or no C++ compiler)")
        if not 1 <= max_rows <= SKINNY_MAX_ROWS:
            raise ValueError(f"max_rows must be between 1 and {SKINNY_MAX_ROWS}, not {max_rows}")
        self.decoder, self.model, self.max_batch, self.max_rows = decoder, decoder.model, max_batch, max_rows
        # allocated by the engine's thread, the only one that does its torch work: filling a cache with zeros is a
        # parallel loop, whose OpenMP workers would stay with the calling thread (runtime/kernels/openmp.py)
        self.cache = self.scratch = None
        self.ranges = SlotRanges(cache_positions or _default_positions(decoder, max_batch))
        self.drafting = DraftingChoice()  # whether grown trees draft at this load (runtime/batching/drafting_choice.py)
        self._drafted: tuple[bool, float] | None = None  # the last step's choice and its drafting's seconds
        self.latency = latency_model(decoder.profile, GROWN_NODES)  # a step's forward seconds by its rows, all answers'
        self.waiting: collections.deque[_Answer] = collections.deque()
        self.active: list[_Answer] = []
        self.steps = 0
        self.busy_seconds = 0.0  # time spent admitting and stepping: the decoding's wall time, all answers together
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    # -- the caller's side ------------------------------------------------------------------------------------
    def submit(self, ids: list[int], options: GenerateOptions, stream: Callable[[list[int]], None] | None = None,
               should_stop: Callable[[], bool] | None = None) -> Future:
        """Queue an answer to prompt `ids` -> a Future of its GenerateResult. `stream` and `should_stop` as
        Decoder.generate's (called on the engine's thread)."""
        method = options.method if options.method == AUTO else self.decoder.resolve_method(options.method)
        ids = self.decoder.fit_prompt(list(ids), options.max_new_tokens, method, options.truncate)
        answer = _Answer(ids, options, AnswerTokens(options.max_new_tokens, self.decoder.eos_ids(), stream,
                                                    should_stop))
        with self._wake:
            if self._closed:
                raise RuntimeError("the batch engine is closed")
            self.waiting.append(answer)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ppdkit-batch", daemon=True)
                self._thread.start()
            self._wake.notify()
        return answer.future

    def generate(self, prompt: list[int], options: GenerateOptions | None = None, **overrides) -> GenerateResult:
        """Decoder.generate through the batch: submit and wait."""
        return self.submit(prompt, merged(options, overrides)).result()

    def close(self) -> None:
        """Stop the engine's thread once the answers in hand are done."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()

    # -- the engine's thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode(), on_device(self.decoder.device):
            # not filled: a row reads its segment's committed slots and its step's rows, each written before it is
            # read (a prompt's copied in, a step's by its forward), so the cache's pages (up to 2 GB of them) stay
            # the system's untouched zero pages until answers write them, and the server's memory grows with its load
            self.cache = self.model.new_cache(self.ranges.capacity, zeroed=False)
            self.scratch = self.model.new_cache(self.decoder.max_length + 64)  # a prompt's read, copied into its range
            while True:
                with self._wake:
                    while not self.waiting and not self.active:
                        if self._closed:
                            return
                        release_openmp_threads()  # idle: no workers of ours may spin beside another thread's
                        self._wake.wait()
                started = time.perf_counter()
                self._admit()
                if self.active:
                    self._step()
                self.busy_seconds += time.perf_counter() - started

    def _admit(self) -> None:
        """Take waiting answers while there is room (in order: one that does not fit yet waits, and so do those
        behind it)."""
        while len(self.active) < self.max_batch:
            with self._wake:
                if not self.waiting:
                    return
                answer = self.waiting[0]
                if answer.future.cancelled():
                    self.waiting.popleft()
                    continue
                try:
                    if not answer.width:  # once, when it first reaches the head, not on every step it waits there
                        answer.method = self.decoder.resolve_method(answer.options.method)  # auto's, measured once
                        self.decoder.fit_prompt(answer.ids, answer.options.max_new_tokens, answer.method, None)
                        answer.width = len(answer.ids) + answer.options.max_new_tokens + self.decoder.step_rows(
                            answer.method) + 1
                    method = get_method(answer.method)
                    start = self.ranges.take(answer.width) if method.shares_steps else None
                except BaseException as e:  # noqa: BLE001 - the answer's error, not the engine's
                    self.waiting.popleft()
                    answer.future.set_exception(e)
                    continue
                if method.shares_steps and start is None and self.active:
                    return  # room frees as answers end
                self.waiting.popleft()
            if not answer.future.set_running_or_notify_cancel():  # cancelled meanwhile
                if start is not None:
                    self.ranges.give_back(start, answer.width)
                continue
            if start is None:  # decoded alone (a method that cannot share, or no range fits even an empty cache)
                self._decode_alone(answer)
            else:
                self._begin(answer, start)

    def _decode_alone(self, answer: _Answer) -> None:
        try:
            answer.future.set_result(self.decoder.generate(
                answer.ids, answer.options.model_copy(update={"method": answer.method}),
                stream=answer.tokens.stream, should_stop=answer.tokens.should_stop))
        except BaseException as e:  # noqa: BLE001
            answer.future.set_exception(e)

    def _begin(self, answer: _Answer, start: int) -> None:
        """Read the prompt alone into the scratch cache, as `generate` reads it, and move it into the answer's range."""
        options, method = answer.options, get_method(answer.method)
        answer.started = time.perf_counter()
        answer.generator = (torch.Generator(self.decoder.device).manual_seed(options.seed)
                            if options.seed is not None else None)
        answer.sizer = self.decoder.draft.new_sizer(self.decoder.profile) if method.sized else None
        answer.segment = CacheSegment(self.cache, start, answer.width)
        for other in self.active:  # the scratch cache is this prompt's now: an answer decoding alone there moves out
            if other.alone:
                self._share(other)
        try:
            self.scratch.rollback(0)
            answer.drafter = method.build(self.decoder, self.scratch, answer.sizer)
            if isinstance(answer.drafter, GrownDrafter):
                answer.drafter.latency = StepShare(self)
            answer.loop = steps(answer.drafter, torch.tensor(answer.ids, dtype=torch.long), answer.tokens.add,
                                options.sampling, answer.generator)
            answer.proposal = next(answer.loop, None)
            answer.alone = not self.active  # the only answer: it stays where its prompt was read until one joins
            if not answer.alone:
                self._share(answer)
        except BaseException as e:  # noqa: BLE001
            self.ranges.give_back(start, answer.width)
            answer.future.set_exception(e)
            return
        if answer.proposal is None:
            self._finish(answer)
        else:
            self.active.append(answer)

    def _share(self, answer: _Answer) -> None:
        """Move an answer's keys/values from the scratch cache into its range of the shared one, where its steps
        are verified with the others'."""
        answer.segment.take(self.scratch)
        answer.drafter.cache, answer.alone = answer.segment, False

    def _verify(self, batch: list[Step], capture: tuple[int, ...]) -> list[Verified]:
        """The step's verification: an answer alone in the engine is verified as `generate` verifies it, in the
        contiguous scratch cache (a shared step's windows and segment commits cost it about 5%); the same rows,
        so the same tokens."""
        if len(self.active) == 1 and self.active[0].alone:
            answer, step = self.active[0], batch[0]
            return [verify(self.model, self.scratch, step.proposal, step.sampling, step.generator, capture,
                           answer.drafter.early)]
        return verify_steps(self.model, self.cache, batch, capture)

    def _step(self) -> None:
        """One forward for every active answer's proposal, then each answer's next proposal."""
        grown = [a.drafter for a in self.active if isinstance(a.drafter, GrownDrafter)]
        drafting = self.drafting.choose(len(self.active)) if grown else True
        cap = max(1, self.max_rows // len(self.active)) if drafting else 1
        for drafter in grown:
            drafter.limit_nodes(cap, shared=len(self.active) > 1)  # applies from its next proposal
        batch = [Step(a.segment, a.proposal, a.options.sampling, a.generator) for a in self.active]
        capture = next((a.drafter.capture for a in self.active if a.drafter.capture), ())
        started = time.perf_counter()
        try:
            verified = self._verify(batch, capture)
        except BaseException as e:  # noqa: BLE001 - every answer of the step fails; the engine goes on
            log.exception("a batched step failed")
            for answer in self.active:
                self._fail(answer, e)
            self.active = []
            return
        seconds = time.perf_counter() - started
        self.latency.observe(sum(step.proposal.rows for step in batch), seconds)
        self.steps += 1
        if self._drafted is not None:  # the last step's drafting and this forward that verified it
            chosen, drafted_seconds = self._drafted
            self.drafting.observe(len(batch), chosen, sum(len(v.accepted) + 1 for v in verified),
                                  drafted_seconds + seconds)
        drafted = time.perf_counter()
        still = []
        for answer, result in zip(self.active, verified):
            result.seconds = {"verify": seconds}
            try:
                answer.proposal = next_proposal(answer.loop, result)
            except BaseException as e:  # noqa: BLE001 - a stream callback's error ends its own answer only
                self._fail(answer, e)
                continue
            if answer.proposal is None:
                self._finish(answer)
            else:
                still.append(answer)
        self.active = still
        self._drafted = (drafting, time.perf_counter() - drafted) if grown else None

    def _finish(self, answer: _Answer) -> None:
        self.ranges.give_back(answer.segment.start, answer.width)
        sizer = answer.sizer
        answer.future.set_result(answer.tokens.result(
            self.decoder.tokenizer, answer.method, self.decoder.step_rows(answer.method),
            time.perf_counter() - answer.started, sizer.chosen if sizer is not None else []))

    def _fail(self, answer: _Answer, error: BaseException) -> None:
        self.ranges.give_back(answer.segment.start, answer.width)
        answer.future.set_exception(error)


def _default_positions(decoder, max_batch: int, budget: int = 2 << 30) -> int:
    """Room for max_batch answers of max_length, within about `budget` bytes of float32 keys and values."""
    model = decoder.model
    per_position = 2 * len(model.layers) * model.kv_heads * model.head_dim * 4
    return max(decoder.max_length + 64, min(max_batch * (decoder.max_length + 64), budget // per_position))



class OneAtATime:
    """BatchEngine's interface where it cannot run (no native kernels: another device): answers decoded one after
    another by Decoder.generate, in one thread of their own."""

    def __init__(self, decoder):
        from concurrent.futures import ThreadPoolExecutor

        self.decoder, self.busy_seconds, self.active = decoder, 0.0, []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="ppdkit-decode")

    def submit(self, ids: list[int], options: GenerateOptions, stream: Callable[[list[int]], None] | None = None,
               should_stop: Callable[[], bool] | None = None) -> Future:
        method = options.method if options.method == AUTO else self.decoder.resolve_method(options.method)
        self.decoder.fit_prompt(list(ids), options.max_new_tokens, method, options.truncate)  # its error, now

        def decode() -> GenerateResult:
            self.active = [ids]
            try:
                result = self.decoder.generate(ids, options, stream=stream, should_stop=should_stop)
            finally:
                self.active = []
            self.busy_seconds += result.seconds
            return result

        return self._pool.submit(decode)

    def close(self) -> None:
        self._pool.shutdown()


def decoding_engine(decoder, max_batch: int) -> "BatchEngine | OneAtATime":
    """A BatchEngine for `decoder`, or one answer at a time where batching cannot run (said once in the log)."""
    try:
        return BatchEngine(decoder, max_batch=max_batch)
    except ValueError as e:
        log.warning("requests are decoded one at a time: %s", e)
        return OneAtATime(decoder)
