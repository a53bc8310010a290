"""What a decoding step costs by its rows, in float32 and bfloat16, against what reading the weights costs here.

Writes docs/measurements/step-costs.json (`--out`): this machine's read bandwidth (torch's sum over a 512 MB float32
array on the runtime's threads, the fastest of 15: a stream the prefetcher follows, as the kernels' panels are;
the fastest, because what other tenants of the VM take varies from one second to the next), the
bytes a step's matmuls read (every packed weight, the LM head included), and per dtype the median latency of one
forward plus LM head of n new rows over 256 cached tokens (ppdkit/runtime/profile.py's measure_latencies, the row
counts in turns), bfloat16 on each of its kernels this CPU has (AVX512-BF16 dot products or float32 FMAs, AMX
tiles), and on AVX512-BF16 both as the runtime runs it (float32 FMAs from the rows where they were faster here,
ppdkit/runtime/native.bf16_fma_rows) and with VDPBF16PS for every row count ("bfloat16-avx512-vdpbf16ps"). Run it on
an idle machine: `python docs/tools/step_costs.py`.
"""

import argparse
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from ppdkit.bench.decoding import machine_info
from ppdkit.runtime.decoder import Decoder
from ppdkit.runtime.native import NEVER, native_kernels
from ppdkit.runtime.profile import measure_latencies

ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80)
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
    vector = [native.vector_kernel()] if native is not None else []  # avx512 or avx2: the build's panels
    kernels = [*vector, "amx"] if native is not None and native.amx_available() else vector
    for dtype, kernel in [("float32", None), *(("bfloat16", kernel) for kernel in kernels)]:
        if kernel:  # bfloat16 on each of its native kernels (ppdkit/runtime/native.bf16_kernel)
            os.environ["PPDKIT_BF16_KERNEL"] = kernel
        decoder = Decoder.from_base(args.base, dtype=dtype)
        size = weight_bytes(decoder)
        dot = kernel == "avx512" and native.bf16_dot_available()  # VDPBF16PS, or FMAs by rows
        chosen = native.bf16_fma_from_rows() if dot else None
        for name, fma_rows in [(f"{dtype}-{kernel}" if kernel else dtype, chosen),
                               *([(f"{dtype}-{kernel}-vdpbf16ps", NEVER)] if dot else [])]:
            if fma_rows is not None:
                native.bf16_fma_from_rows(fma_rows)
            latency = measure_latencies(decoder.model, list(ROWS), args.context)
            report["dtypes"][name] = {
                "weight_bytes": size, "read_once_ms": 1000 * size / bandwidth,
                "latency_ms": {str(n): 1000 * s for n, s in latency.items()},
                "x_one_row": {str(n): s / latency[1] for n, s in latency.items()}}
            if dot:
                report["dtypes"][name]["fma_from_rows"] = fma_rows if fma_rows < NEVER else None
        if chosen is not None:
            native.bf16_fma_from_rows(chosen)
        del decoder
    args.out.write_text(json.dumps(report, indent=2))
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s; wrote {args.out}")
    for dtype, figures in report["dtypes"].items():
        print(f"{dtype}: weights {figures['weight_bytes'] / 1e6:.0f} MB, read once {figures['read_once_ms']:.1f} ms; "
              + ", ".join(f"{n} rows {ms:.1f} ms" for n, ms in figures["latency_ms"].items()))


if __name__ == "__main__":
    main()
