"""The server's counters, and their Prometheus text for GET /metrics."""

from dataclasses import dataclass, field

from ppdkit.runtime.decoder import GenerateResult


@dataclass
class ServerStats:
    requests: int = 0
    failed: int = 0
    tokens: int = 0
    steps: int = 0
    seconds: float = 0.0
    waiting: int = 0
    by_method: dict[str, int] = field(default_factory=dict)

    def add(self, result: GenerateResult) -> None:
        self.requests += 1
        self.tokens += len(result.tokens)
        self.steps += len(result.accepted_per_step)
        self.seconds += result.seconds
        self.by_method[result.method] = self.by_method.get(result.method, 0) + 1

    def prometheus(self, model: str, engine) -> str:
        """The counters, and the decoding engine's own (runtime/batching/batch_engine.py: busy time, answers held)."""
        rate = self.tokens / engine.busy_seconds if engine.busy_seconds else 0.0
        per_step = self.tokens / self.steps if self.steps else 0.0
        lines = [
            "# HELP ppdkit_requests_total Requests decoded.", "# TYPE ppdkit_requests_total counter",
            f'ppdkit_requests_total{{model="{model}"}} {self.requests}',
            "# HELP ppdkit_failed_requests_total Requests refused or failed.", "# TYPE ppdkit_failed_requests_total counter",
            f'ppdkit_failed_requests_total{{model="{model}"}} {self.failed}',
            "# HELP ppdkit_generated_tokens_total New tokens decoded.", "# TYPE ppdkit_generated_tokens_total counter",
            f'ppdkit_generated_tokens_total{{model="{model}"}} {self.tokens}',
            "# HELP ppdkit_request_seconds_total Time from each request's start of decoding to its end, summed.",
            "# TYPE ppdkit_request_seconds_total counter",
            f'ppdkit_request_seconds_total{{model="{model}"}} {self.seconds:.6f}',
            "# HELP ppdkit_decode_seconds_total Time the engine spent decoding (requests decoded together count once).",
            "# TYPE ppdkit_decode_seconds_total counter",
            f'ppdkit_decode_seconds_total{{model="{model}"}} {engine.busy_seconds:.6f}',
            "# HELP ppdkit_decoding_requests Requests being decoded together now.",
            "# TYPE ppdkit_decoding_requests gauge", f'ppdkit_decoding_requests{{model="{model}"}} {len(engine.active)}',
            "# HELP ppdkit_tokens_per_second New tokens per second of decoding, over all requests.",
            "# TYPE ppdkit_tokens_per_second gauge", f'ppdkit_tokens_per_second{{model="{model}"}} {rate:.4f}',
            "# HELP ppdkit_tokens_per_step New tokens per model forward, over all requests.",
            "# TYPE ppdkit_tokens_per_step gauge", f'ppdkit_tokens_per_step{{model="{model}"}} {per_step:.4f}',
            "# HELP ppdkit_waiting_requests Requests admitted and not yet answered (decoding or queued).",
            "# TYPE ppdkit_waiting_requests gauge", f'ppdkit_waiting_requests{{model="{model}"}} {self.waiting}',
            "# HELP ppdkit_requests_by_method_total Requests decoded, by the method that ran.",
            "# TYPE ppdkit_requests_by_method_total counter",
        ]
        lines += [f'ppdkit_requests_by_method_total{{model="{model}",method="{m}"}} {n}'
                  for m, n in sorted(self.by_method.items())]
        return "\n".join(lines) + "\n"
