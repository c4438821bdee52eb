"""Native memory over load-generate-unload cycles: the process's resident size after each cycle.

    PYTHONPATH=py python bench/native_soak.py --model FILE.slm [--cycles 50] [--out FILE]

Each cycle makes a fresh Engine on one NativeGpu, loads the model onto the GPU (admission,
build), answers one short greedy prompt and unloads. A leak per cycle (device objects, command
buffers, staging) shows as a resident size that keeps rising; `growth` compares the last cycle
with the second (the first pays one-time costs: the driver, the JIT, numpy's pools).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import pathlib
import time

import webslm
from webslm.engine import Engine
from webslm.generate import prompt_ids
from webslm.semantic.sampler import SamplerSettings
from webslm.webgpu.native import NativeGpu


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def load_average() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


async def soak(path: str, cycles: int) -> dict:
    load_before = load_average()
    model = webslm.open_model(path)
    gpu = NativeGpu()
    ids = prompt_ids(model, "hi there", chat=True)
    rows = []
    for cycle in range(cycles):
        started = time.perf_counter()
        engine = Engine(model, gpu=gpu)
        await engine.load()
        async for _ in engine.generate(list(ids), SamplerSettings(temperature=0.0, max_tokens=8), chat=False):
            pass
        backend = engine.backend_kind
        await engine.unload()
        del engine
        gc.collect()
        rows.append({"cycle": cycle, "backend": backend, "resident_mib": round(resident_mib(), 1),
                     "seconds": round(time.perf_counter() - started, 2)})
        print(rows[-1], flush=True)
    second, last = rows[min(1, cycles - 1)]["resident_mib"], rows[-1]["resident_mib"]
    return {"model": pathlib.Path(path).name, "cycles": cycles, "growth": round(last / second - 1, 4),
            "load_average_before": load_before, "load_average_after": load_average(), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--out")
    args = parser.parse_args()
    report = asyncio.run(soak(args.model, args.cycles))
    print(f"resident growth from cycle 1 to {args.cycles - 1}: {report['growth']:+.1%}")
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
