"""What a decoding step costs by its rows, in float32 and bfloat16, against what reading the weights costs here.

Writes docs/measurements/step-costs.json (`--out`): this machine's read bandwidth (torch's sum over a 512 MB float32
array on the runtime's threads, the fastest of 15: a stream the prefetcher follows, as the kernels' panels are;
the fastest, because what other tenants of the VM take varies from one second to the next), the
bytes a step's matmuls read (every packed weight, the LM head included), and per dtype the median latency of one
forward plus LM head of n new rows over 256 cached tokens (ppdkit/runtime/trees/profile.py's measure_latencies, the row
counts in turns), bfloat16 on each of its kernels this CPU has (AVX512-BF16 dot products or float32 FMAs, AMX
tiles), and on AVX512-BF16 both as the runtime runs it (float32 FMAs from the rows where they were faster here,
ppdkit/runtime/kernels/native.bf16_fma_rows) and with VDPBF16PS for every row count ("bfloat16-avx512-vdpbf16ps"). Run
it on an idle machine: `python docs/tools/step_costs.py`.

The base model's own GGUF blocks (`gguf`, Q4_1 on the int8 kernel) are timed too, with AMX-INT8 tiles from their
row count where the CPU has them and on AVX512-VNNI for every count ("gguf-vnni"), against a roofline: the weight
read at the measured bandwidth, or the rows' int8 multiply-adds at the kernel's own rate on a weight in cache,
whichever is longer. Where `make setup-llama-server` built llama.cpp's `llama-bench`, its batched figures for the
same file join them (`llama.cpp`: pp n as the ms of a step of n rows over an empty context, tg128 as one row's).
"""

import argparse
import json
import os
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from ppdkit.bench.decoding import machine_info
from ppdkit.bench.serving_backends import Unavailable, llama_server_binary
from ppdkit.models.catalog import base_gguf
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.forward.gguf_blocks import quantize_q4_1
from ppdkit.runtime.kernels.native import NEVER, native_kernels
from ppdkit.runtime.trees.profile import measure_latencies

ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80)
STEP_ROWS = 8  # a decoding step's counts (1-8) are taken in turns among themselves, the larger ones apart
OUT = Path(__file__).resolve().parents[1] / "measurements" / "step-costs.json"


def read_bandwidth(megabytes: int = 512, repeats: int = 15) -> float:
    """Bytes per second torch reads summing a `megabytes` float32 array (the fastest of `repeats`, after a
    warm-up)."""
    data = torch.ones(megabytes * 2 ** 20 // 4)
    data.sum()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - started)
    return data.numel() * 4 / min(times)


def weight_bytes(decoder: Decoder) -> int:
    """The bytes a one-row step's matmuls read: every packed weight panel, the LM head's included."""
    model = decoder.model
    linears = [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [model.head]
    return sum(lin.panels.numel() * lin.panels.element_size() for lin in linears)


def by_rows(model, context: int, rounds: int = 9) -> dict[int, float]:
    """measure_latencies over ROWS, a step's row counts in turns among themselves and the larger ones apart: taken in
    one set of turns, the 48-80 row forwards slowed the one-row forward after them (on the 2-core AMX Xeon, gguf: one
    row 7.6-8.0 ms beside them, 5.8-7.1 without, in the same process)."""
    return {**measure_latencies(model, [n for n in ROWS if n <= STEP_ROWS], context, rounds),
            **measure_latencies(model, [n for n in ROWS if n > STEP_ROWS], context, rounds)}


def int8_rate(native, rows: int = 12, repeats: int = 15) -> float:
    """Multiply-adds per second of the int8 kernel on a 3072 x 576 Q4_1 weight in cache (1 MB: no memory stream),
    `rows` rows on VNNI (one pass): the compute side of the gguf roofline."""
    generator = torch.Generator().manual_seed(0)
    weight = quantize_q4_1(torch.randn(3072, 576, generator=generator))
    panels = native.quantized_pack(weight.codes, weight.scale, weight.minimum)
    x = torch.randn(rows, 576, generator=generator)
    native.quantized_linear(x, panels, 3072, NEVER)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        native.quantized_linear(x, panels, 3072, NEVER)
        times.append(time.perf_counter() - started)
    return rows * 3072 * 576 / min(times)


def llama_bench(base: str, threads: int) -> dict | None:
    """llama.cpp's llama-bench on the base model's GGUF, built beside llama-server (None where it is not):
    {"latency_ms": {n: ms of pp n, n rows at once}, "tg128_ms": ms a token of tg128, "build": its build line}."""
    try:
        binary = llama_server_binary(None).with_name("llama-bench")
    except Unavailable:
        return None
    if not binary.is_file():
        return None
    sizes = [n for n in ROWS if n <= 64]
    out = subprocess.run([str(binary), "-m", str(base_gguf(base)), "-t", str(threads), "-p",
                          ",".join(map(str, sizes)), "-n", "128", "-r", "3", "-o", "json"], capture_output=True,
                         text=True, check=True).stdout
    runs = json.loads(out)
    pp = {run["n_prompt"]: run["avg_ts"] for run in runs if run["n_prompt"] and not run["n_gen"]}
    tg = next(run["avg_ts"] for run in runs if run["n_gen"] and not run["n_prompt"])
    return {"latency_ms": {str(n): 1000 * n / pp[n] for n in sizes}, "tg128_ms": 1000 / tg,
            "build": f"{runs[0].get('build_commit', '?')} ({runs[0].get('cpu_info', '?')})"}


def gguf_costs(base: str, context: int, bandwidth: float, native) -> tuple[dict, dict | None]:
    """The base model on its GGUF blocks: latency by rows with the kernel's own AMX-INT8 threshold ("gguf") and,
    where the CPU has AMX-INT8, on VNNI for every count ("gguf-vnni"), each with its roofline; and llama-bench's
    figures (llama_bench), taken in the same turns: this VM's speed moved by 1.5x from one minute to the next, so
    a peer measured after ours is no peer."""
    decoder = Decoder.from_base(base, dtype="gguf")
    size, rate = weight_bytes(decoder), int8_rate(native)
    params = sum(lin.out_features * lin.in_features for layer in decoder.model.layers
                 for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)) + decoder.model.head.out_features * \
        decoder.model.head.in_features
    read_ms = 1000 * size / bandwidth
    roofline = {str(n): max(read_ms, 1000 * n * params / rate) for n in ROWS}
    default = native.quantized_amx_from_rows()
    kernels = {"gguf": default, **({"gguf-vnni": NEVER} if native.quantized_amx_available() else {})}
    # the kernels and llama.cpp in turns too, 3 rounds each a turn (a VM's slow spell lands on no one of them), each
    # figure's median
    turns: dict[str, dict[int, list[float]]] = {name: {n: [] for n in ROWS} for name in kernels}
    peers = []
    for _ in range(5):
        for name, threshold in kernels.items():
            native.quantized_amx_from_rows(threshold)
            for n, seconds in by_rows(decoder.model, context, rounds=3).items():
                turns[name][n].append(seconds)
        peers.append(llama_bench(base, torch.get_num_threads()))
    native.quantized_amx_from_rows(default)
    out = {}
    for name, threshold in kernels.items():
        latency = {n: sorted(times)[len(times) // 2] for n, times in turns[name].items()}
        out[name] = {"weight_bytes": size, "read_once_ms": read_ms, "int8_macs_per_s": rate, "roofline_ms": roofline,
                     "amx_int8_from_rows": threshold if threshold < NEVER else None,
                     "latency_ms": {str(n): 1000 * s for n, s in latency.items()},
                     "x_one_row": {str(n): s / latency[1] for n, s in latency.items()}}
    if peers[0] is None:
        return out, None
    llama = {"latency_ms": {n: _median([p["latency_ms"][n] for p in peers]) for n in peers[0]["latency_ms"]},
             "tg128_ms": _median([p["tg128_ms"] for p in peers]), "build": peers[0]["build"]}
    return out, llama


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="smollm2-135m")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    bandwidth = read_bandwidth()
    report = {"base": args.base, "context": args.context, "read_bytes_per_s": bandwidth, "dtypes": {},
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine_info()}
    native = native_kernels()
    llama = None
    if native is not None and native.quantized_available():  # the format the default runs, first
        gguf, llama = gguf_costs(args.base, args.context, bandwidth, native)
        report["dtypes"].update(gguf)
    vector = [native.vector_kernel()] if native is not None else []  # avx512 or avx2: the build's panels
    kernels = [*vector, "amx"] if native is not None and native.amx_available() else vector
    for dtype, kernel in [("float32", None), *(("bfloat16", kernel) for kernel in kernels)]:
        if kernel:  # bfloat16 on each of its native kernels (ppdkit/runtime/kernels/native.bf16_kernel)
            os.environ["PPDKIT_BF16_KERNEL"] = kernel
        decoder = Decoder.from_base(args.base, dtype=dtype)
        size = weight_bytes(decoder)
        dot = kernel == "avx512" and native.bf16_dot_available()  # VDPBF16PS, or FMAs by rows
        chosen = native.bf16_fma_from_rows() if dot else None
        for name, fma_rows in [(f"{dtype}-{kernel}" if kernel else dtype, chosen),
                               *([(f"{dtype}-{kernel}-vdpbf16ps", NEVER)] if dot else [])]:
            if fma_rows is not None:
                native.bf16_fma_from_rows(fma_rows)
            latency = by_rows(decoder.model, args.context)
            report["dtypes"][name] = {
                "weight_bytes": size, "read_once_ms": 1000 * size / bandwidth,
                "latency_ms": {str(n): 1000 * s for n, s in latency.items()},
                "x_one_row": {str(n): s / latency[1] for n, s in latency.items()}}
            if dot:
                report["dtypes"][name]["fma_from_rows"] = fma_rows if fma_rows < NEVER else None
        if chosen is not None:
            native.bf16_fma_from_rows(chosen)
        del decoder
    if llama is not None:
        report["llama_cpp"] = llama
    args.out.write_text(json.dumps(report, indent=2))
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s; wrote {args.out}")
    for dtype, figures in report["dtypes"].items():
        print(f"{dtype}: weights {figures['weight_bytes'] / 1e6:.0f} MB, read once {figures['read_once_ms']:.1f} ms; "
              + ", ".join(f"{n} rows {ms:.1f} ms" for n, ms in figures["latency_ms"].items()))
    if llama is not None:
        print(f"llama.cpp: tg128 {llama['tg128_ms']:.1f} ms a token; "
              + ", ".join(f"pp{n} {ms:.1f} ms" for n, ms in llama["latency_ms"].items()))


if __name__ == "__main__":
    main()
