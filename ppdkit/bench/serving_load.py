"""`ppdkit serve-bench`: the comparison serving users make. The same streamed chat requests (greedy, the same prompts)
from N concurrent clients against each server kind (bench/serving_backends.py), one server at a time, and per level:

- tokens_per_s: every completion token of the level / the level's wall time (first request sent to last answer done);
- ttft_ms p50/p99: time to first token, from sending a request to the first chunk that carries text;
- tpot_ms p50/p99: per-token latency of a request, (last chunk - first text chunk) / (completion tokens - 1), so a
  server that streams several tokens per chunk (a speculative one) is measured as one that streams them one by one;
- latency_s p50: a request's whole time;
- peak_rss_mib: the server's resident memory, its process tree's VmRSS summed (psutil where installed, else /proc),
  sampled every SAMPLE_SECONDS during the level; the server's overall peak is the largest of those;
- identical: answers whose text equals the one the same prompt got from the same server at 1 client (run first);
- same_as_plain (a drafting server, llama.cpp-eagle3 or vllm-eagle3, where its plain twin ran too): its answers at
  1 client whose text equals its twin's at 1 client, the same build without the draft;
- where the server says: ppdkit's tokens per decoding step (its answers' `ppdkit` field), vLLM's draft tokens proposed
  and accepted (its /metrics counters over the level).

A level of N clients sends max(prompts, N) requests, the prompts in turn, through N client threads: each client sends
its next request when its last answer is done (a closed loop), so N requests are in flight until the last few.
"""

import http.client
import json
import logging
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .serving_backends import SERVERS, RunningServer, ServeBenchSettings, Unavailable, free_port, running

log = logging.getLogger(__name__)
SAMPLE_SECONDS = 0.2
REQUEST_TIMEOUT = 1800.0  # seconds a request may take: 64 clients on a one-at-a-time server wait long
PER_TOKEN_LATENCY = "(last chunk - first text chunk) / (completion tokens - 1), per request with 2 or more tokens"


@dataclass
class Answer:
    prompt: int
    text: str
    tokens: int
    sent: float
    first: float | None  # when the first chunk with text came (perf_counter)
    done: float
    counted: str  # "usage": the server's completion_tokens; "chunks": chunks with text (a server that gave no usage)
    error: str | None = None
    steps: int | None = None  # decoding steps, where the server says (ppdkit's `ppdkit` field in its last chunk)


def stream_chat(url: str, model: str, prompt: str, index: int, max_tokens: int,
                timeout: float = REQUEST_TIMEOUT) -> Answer:
    """One streamed chat completion (greedy), read event by event as it arrives."""
    host, port = url.removeprefix("http://").split(":")
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    connection = http.client.HTTPConnection(host, int(port), timeout=timeout)
    pieces: list[str] = []
    first = usage = steps = None
    chunks = 0
    sent = time.perf_counter()
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            error = response.read().decode(errors="replace")[:500]
            return Answer(index, "", 0, sent, None, time.perf_counter(), "none", f"HTTP {response.status}: {error}")
        while line := response.readline():
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                return Answer(index, "".join(pieces), 0, sent, first, time.perf_counter(), "none",
                              f"error event: {event['error']}")
            usage = event.get("usage") or usage
            steps = (event.get("ppdkit") or {}).get("steps", steps)
            for choice in event.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    first = first or time.perf_counter()
                    chunks += 1
                    pieces.append(text)
        done = time.perf_counter()
    except (OSError, http.client.HTTPException, ValueError) as e:
        return Answer(index, "".join(pieces), 0, sent, first, time.perf_counter(), "none", f"{type(e).__name__}: {e}")
    finally:
        connection.close()
    if usage and usage.get("completion_tokens") is not None:
        return Answer(index, "".join(pieces), usage["completion_tokens"], sent, first, done, "usage", steps=steps)
    return Answer(index, "".join(pieces), chunks, sent, first, done, "chunks", steps=steps)


def tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and all its descendants (0 once it has ended)."""
    try:
        import psutil
    except ImportError:
        return _proc_tree_rss(pid)
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in processes:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass  # ended between the listing and the reading
    return total


def _proc_tree_rss(pid: int) -> int:
    """tree_rss from /proc alone: parents from each /proc/N/stat, VmRSS from /proc/N/status."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo += children.get(current, [])
        try:
            status = (Path("/proc") / str(current) / "status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return total


class PeakMemory:
    """A thread sampling tree_rss(pid) every SAMPLE_SECONDS; `take()` returns the peak since the last take."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, tree_rss(pid), threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, tree_rss(self.pid))

    def take(self) -> int:
        peak, self.peak = max(self.peak, tree_rss(self.pid)), 0
        return peak

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def run_level(server: RunningServer, prompts: list[str], clients: int, max_tokens: int) -> tuple[list[Answer], float]:
    """`clients` concurrent clients sending max(len(prompts), clients) requests, the prompts in turn: the answers (in
    the order sent) and the level's wall seconds."""
    order = [i % len(prompts) for i in range(max(len(prompts), clients))]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        futures = [pool.submit(stream_chat, server.url, server.model, prompts[i], i, max_tokens) for i in order]
        for _ in tqdm(as_completed(futures), total=len(futures), desc=f"{server.kind} x{clients}", unit="req",
                      leave=False):
            pass
    wall = time.perf_counter() - started
    return [f.result() for f in futures], wall


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def level_figures(clients: int, answers: list[Answer], wall: float, reference: dict[int, str], peak_rss: int) -> dict:
    """One level's figures (see the module's docstring)."""
    ok = [a for a in answers if a.error is None]
    ttft = [(a.first - a.sent) * 1000 for a in ok if a.first is not None]
    tpot = [(a.done - a.first) * 1000 / (a.tokens - 1) for a in ok if a.first is not None and a.tokens >= 2]
    latency = [a.done - a.sent for a in ok]
    tokens = sum(a.tokens for a in ok)
    return {"clients": clients, "requests": len(answers), "errors": len(answers) - len(ok),
            **({"first_error": next(a.error for a in answers if a.error)} if len(ok) < len(answers) else {}),
            "completion_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "ttft_ms_p50": _percentile(ttft, 50), "ttft_ms_p99": _percentile(ttft, 99),
            "tpot_ms_p50": _percentile(tpot, 50), "tpot_ms_p99": _percentile(tpot, 99),
            "latency_s_p50": _percentile(latency, 50), "peak_rss_mib": peak_rss / 2**20,
            "identical": sum(a.error is None and a.text == reference.get(a.prompt) for a in answers),
            "tokens_counted_by": sorted({a.counted for a in ok}),
            # tokens per decoding step where the server reports its steps (ppdkit): what its draft gained
            **({"tokens_per_step": tokens / sum(a.steps for a in ok)} if ok and all(a.steps for a in ok) else {})}


def server_counters(server: RunningServer) -> dict[str, float]:
    """The server's /metrics counters the kind names (vLLM's speculative decoding: tokens drafted and accepted), summed
    over their labels; {} where it names none or /metrics does not answer."""
    if not server.counters:
        return {}
    try:
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return {}
    found = dict.fromkeys(server.counters.values(), 0.0)
    for line in text.splitlines():  # `name{labels} value`, or `name value`; comments start with #
        if line.startswith("#") or not line.strip():
            continue
        key = server.counters.get(line.split("{", 1)[0].split(" ", 1)[0].removesuffix("_total"))
        if key is not None:
            found[key] += float(line.rsplit(" ", 1)[-1])
    return found


def bench_server(server: RunningServer, prompts: list[str], clients: list[int], max_tokens: int,
                 alone: dict | None = None) -> dict:
    """Every level against one running server, 1 client first (its answers are the reference; ppdkit's are also
    compared with `ppdkit decode`'s, `alone`)."""
    stream_chat(server.url, server.model, prompts[0], 0, min(max_tokens, 8))  # warm-up: first-request costs unmeasured
    memory = PeakMemory(server.pid)
    levels, reference, same_as_decode = [], {}, None
    try:
        memory.take()
        for n in clients:
            before = server_counters(server)
            answers, wall = run_level(server, prompts, n, max_tokens)
            if n == 1:
                reference = {a.prompt: a.text for a in answers if a.error is None}
                same_as_decode = (sum(alone["texts"][i] == text for i, text in reference.items())
                                  if alone and server.kind == "ppdkit" else None)
            levels.append(level_figures(n, answers, wall, reference, memory.take()))
            if before:  # what the server counted over the level (tokens its draft proposed and it accepted)
                levels[-1]["server_counters"] = {k: v - before[k] for k, v in server_counters(server).items()}
            row = levels[-1]
            log.info("%s, %d client%s: %.1f tokens/s, %d/%d answers as at 1 client%s", server.kind, n,
                     "s" if n > 1 else "", row["tokens_per_s"], row["identical"], row["requests"],
                     f", {row['errors']} errors (first: {row['first_error']})" if row["errors"] else "")
    finally:
        memory.close()
    return {"startup_s": server.startup_seconds, "peak_rss_mib": max(r["peak_rss_mib"] for r in levels),
            "levels": levels, **({"same_as_decode": same_as_decode} if same_as_decode is not None else {}),
            "texts": reference}  # the caller's to compare, not the report's


def decode_alone(settings: ServeBenchSettings, prompts: list[str]) -> dict:
    """What `ppdkit decode` gives on the same prompts with the same method: the decoder in this process, one prompt
    after another (what one client through `ppdkit serve` is held to), and its answers' texts."""
    import gc

    from ppdkit.runtime.decoder import Decoder

    load = Decoder.from_base if settings.base_only else Decoder.from_pretrained
    decoder = load(settings.source, dtype=settings.dtype)
    decoder.generate(prompts[0], max_new_tokens=8, method=settings.method)  # the warm-up the servers get
    results = [decoder.generate(p, max_new_tokens=settings.max_tokens, method=settings.method)
               for p in tqdm(prompts, desc="ppdkit decode alone", unit="prompt", leave=False)]
    tokens, seconds = sum(len(r.tokens) for r in results), sum(r.seconds for r in results)
    del decoder
    gc.collect()
    return {"method": results[0].method, "tokens_per_s": round(tokens / seconds, 2),
            "tokens_per_step": round(tokens / sum(r.steps for r in results), 3),
            "texts": {i: r.text for i, r in enumerate(results)}}


def parse_clients(text: str) -> list[int]:
    """"1,4,16,64" -> [1, 4, 16, 64]: positive integers, sorted, 1 added where missing (it gives the reference)."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"--clients takes comma-separated positive integers (e.g. 1,4,16,64), not {text!r}") from None
    if not values or values[0] < 1:
        raise ValueError(f"--clients takes comma-separated positive integers (e.g. 1,4,16,64), not {text!r}")
    return values if values[0] == 1 else [1, *values]


PLAIN_TWIN = {"llama.cpp-eagle3": "llama.cpp", "vllm-eagle3": "vllm"}  # a drafting server's answers are held to these


def run_serve_bench(kinds: list[str], settings: ServeBenchSettings, prompts: list[str], prompts_source: str,
                    clients: list[int], port: int = 0, startup_timeout: float = 900.0,
                    command: str | None = None) -> dict:
    """Each kind started, driven at every level of `clients`, and stopped, one after another; the report. A kind that
    cannot run here is recorded as skipped (with what provides it), one that fails to start or dies as failed (with
    its log's tail); the others still run."""
    from .decoding import machine_info

    alone = decode_alone(settings, prompts) if "ppdkit" in kinds else None
    if alone:
        log.info("ppdkit decode alone (%s): %.1f tokens/s", alone["method"], alone["tokens_per_s"])
    servers, texts = [], {}
    for kind in kinds:
        entry, server_port = {"name": kind}, port or free_port()
        try:
            launch = SERVERS[kind](settings, server_port)
        except Unavailable as e:
            log.warning("%s skipped: %s", kind, e)
            servers.append({**entry, "status": "skipped", "reason": str(e), "provided_by": e.provided_by})
            continue
        except ValueError as e:  # what it would serve is wrong (a draft of another base model, no GGUF): the rest run
            log.error("%s failed: %s", kind, e)
            servers.append({**entry, "status": "failed", "reason": str(e)})
            continue
        entry["serves"] = launch.serves
        log.info("starting %s (its log: %s)", kind, settings.work / f"{kind}.log")
        try:
            with running(launch, server_port, settings.work / f"{kind}.log", startup_timeout) as server:
                log.info("%s ready in %.1f s", kind, server.startup_seconds)
                result = bench_server(server, prompts, clients, settings.max_tokens, alone)
                texts[kind] = result.pop("texts")
                servers.append({**entry, "status": "ran", **result})
        except RuntimeError as e:
            log.error("%s failed: %s", kind, e)
            servers.append({**entry, "status": "failed", "reason": str(e).splitlines()[0]})
    for entry in servers:  # a drafting server's answers at 1 client against its plain twin's, where both ran
        plain = PLAIN_TWIN.get(entry["name"])
        if entry["status"] == "ran" and plain in texts:
            reference = texts[plain]
            entry["same_as_plain"] = {"server": plain, "equal": sum(text == reference.get(i) for i, text in
                                                                    texts[entry["name"]].items()),
                                      "compared": len(texts[entry["name"]])}
    return {"kind": "serving-load", "command": command, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine_info(), "source": settings.source,
            "method": settings.method, "prompts_source": prompts_source, "prompts": len(prompts),
            "max_tokens": settings.max_tokens, "temperature": 0, "clients": clients,
            "per_token_latency": PER_TOKEN_LATENCY, "memory": "peak of the process tree's summed VmRSS, sampled "
            f"every {SAMPLE_SECONDS} s",
            "decode_alone": {k: v for k, v in alone.items() if k != "texts"} if alone else None, "servers": servers}


def print_table(report: dict) -> None:
    """The report as a table: a row per server and level."""
    header = (f"{'server':<12} {'clients':>7} {'tok/s':>8} {'TTFT p50':>9} {'p99':>8} {'TPOT p50':>9} {'p99':>7} "
              f"{'lat p50':>8} {'RSS MiB':>8} {'identical':>9}")
    print(f"\n{header}\n{'':<12} {'':>7} {'':>8} {'ms':>9} {'ms':>8} {'ms':>9} {'ms':>7} {'s':>8}")
    fmt = lambda v, spec: format(v, spec) if v is not None else f"{'-':>{spec.split('.')[0]}}"  # noqa: E731
    for server in report["servers"]:
        if server["status"] != "ran":
            print(f"{server['name']:<12} {server['status']}: {server['reason']}")
            continue
        for r in server["levels"]:
            print(f"{server['name']:<12} {r['clients']:>7} {r['tokens_per_s']:>8.1f} {fmt(r['ttft_ms_p50'], '9.0f')} "
                  f"{fmt(r['ttft_ms_p99'], '8.0f')} {fmt(r['tpot_ms_p50'], '9.1f')} {fmt(r['tpot_ms_p99'], '7.1f')} "
                  f"{fmt(r['latency_s_p50'], '8.2f')} {r['peak_rss_mib']:>8.0f} "
                  f"{r['identical']:>4}/{r['requests']:<4}" + (f"  {r['errors']} errors" if r["errors"] else ""))
    alone, ppdkit = report.get("decode_alone"), next((s for s in report["servers"] if s["name"] == "ppdkit" and
                                                      s["status"] == "ran"), None)
    if alone and ppdkit:
        one = ppdkit["levels"][0]
        print(f"ppdkit decode alone ({alone['method']}): {alone['tokens_per_s']:.1f} tok/s; through the server at 1 "
              f"client {one['tokens_per_s'] / alone['tokens_per_s']:.2f}x of it; answers equal to decode's: "
              f"{ppdkit['same_as_decode']}/{one['requests']}")
    for server in report["servers"]:
        if "same_as_plain" in server:
            same = server["same_as_plain"]
            print(f"{server['name']}: answers at 1 client equal to {same['server']}'s: "
                  f"{same['equal']}/{same['compared']}")
    started = ", ".join(f"{s['name']} {s['startup_s']:.1f} s" for s in report["servers"] if s["status"] == "ran")
    print(f"started in: {started}" if started else "no server ran")
    print(f"{report['prompts']} {report['prompts_source']} prompts, {report['max_tokens']} tokens, greedy; TPOT: "
          f"{report['per_token_latency']}; identical: answers equal to the same server's at 1 client")


def write_report(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
