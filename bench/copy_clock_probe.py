"""Why the copy roofline once read 1.6 TB/s and once 4.1 on the same H200: the copy timed again
and again around a model's admission and decode, each reading with the GPU's SM and memory
clocks (nvidia-smi, where there is one). It found the SM clock at 645 of 1980 MHz right after
an admission (seconds of host work): the first copy there read 1.7 TB/s, the next ones 4.0+.
So bench/kernels.py's copy_roofline times until two readings agree and keeps the best.

    PYTHONPATH=py python bench/copy_clock_probe.py --model llama8b.slm --out bench/results/copyprobe_h200.json
    (--quick: 16 MiB copies, a short decode; for a software adapter)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from engine import one_run
from kernels import copy_roofline, open_device

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.webgpu.native import NativeGpu

MiB = 1 << 20


def clocks() -> str:
    """"SM MHz, memory MHz, power, P-state" of the first NVIDIA GPU, or why there is none."""
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,pstate",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"no nvidia-smi ({type(exc).__name__})"


async def copies(device, label: str, log: list, times: int, sizes_mib: tuple[int, ...], quick: bool) -> None:
    """`times` single copy_roofline readings of each size (tries=1: the raw readings are the point)."""
    for size in sizes_mib:
        for _ in range(times):
            started = time.perf_counter()
            reading = await copy_roofline(device, quick, 2 * size * MiB, tries=1)
            log.append({"label": label, "size_mib": size, "gbps": round(reading["gbps"], 1),
                        "us": round(reading["us"], 1), "seconds": round(time.perf_counter() - started, 2),
                        "clocks": clocks()})
            print(json.dumps(log[-1]), flush=True)


async def main(args) -> list:
    log: list = []
    sizes = (16,) if args.quick else (256,)
    model = webslm.open_model(args.model)
    print("clocks idle:", clocks(), flush=True)
    _, bare = await open_device(NativeGpu())
    await copies(bare, "bare device", log, 1 if args.quick else 3, (16,) if args.quick else (256, 1024, 64), args.quick)
    session = await admit(NativeGpu(), model, AdmissionPolicy(tuning="auto"))
    backend = await GpuBackend.build(session, model)
    await copies(session.device, "after admission", log, 1 if args.quick else 4, sizes, args.quick)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, model.architecture.vocab, 8 if args.quick else 128)]
    new_tokens = 4 if args.quick else 64
    for run in range(2):
        result = await one_run(backend, prompt, new_tokens)
        log.append({"label": f"decode run {run}", "tokens_per_s": round(new_tokens / result["decode_s"], 1), "clocks": clocks()})
        print(json.dumps(log[-1]), flush=True)
        await copies(session.device, f"after decode {run}", log, 1 if args.quick else 2, sizes, args.quick)
    await asyncio.sleep(3)
    await copies(session.device, "after 3 s idle", log, 1 if args.quick else 3, sizes, args.quick)
    return log


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    pathlib.Path(args.out).write_text(json.dumps(asyncio.run(main(args)), indent=1))
