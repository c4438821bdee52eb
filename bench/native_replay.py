"""The native decode step's encoding: the C replay loop against the Python loop, side by side.

    .venv/bin/python bench/native_replay.py --model FILE.slm [--rounds 20] [--per-round 25] [--out JSON]

Admits the model on the native adapter, builds its GPU backend and takes its recorded
argmax decode step. Then, in alternating rounds (C, Python, C, ...), encodes that step
`--per-round` times with each loop (webgpu/native_replay.py; the Python loop is the same
recording without its C arrays), submits the command buffers and waits for the GPU before the
next round, so no encoding overlaps GPU work and no command buffer is left unsubmitted (each
holds ~25 MB on lavapipe). Reports the median microseconds of one whole encoding (encoder,
compute pass, the dispatches, the readback copies, finish) per loop and their ratio.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import platform
import statistics
import time

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.webgpu import native_replay
from webslm.webgpu.native import NativeGpu


async def measure(path: str, rounds: int, per_round: int) -> dict:
    model = webslm.open_model(path)
    gpu = NativeGpu()
    adapter = (await gpu.request_adapter("core")).summary().description
    session = await admit(gpu, model, AdmissionPolicy(context=256, tuning="off"))
    backend = await GpuBackend.build(session, model)
    try:
        device = session.device.inner
        if device.replay is None:
            raise SystemExit("replay.c is not built (tools/build_kernels.py) or WEBSLM_NATIVE_REPLAY=off")
        recording = backend._recordings[("decode", False, "argmax", 1)]
        loops = {"c": recording,
                 "python": recording.__class__(recording.dispatches, recording.copies,
                                               native_replay.Commands(recording.handle.rows))}
        read = backend._read("argmax", 1)
        times: dict[str, list[float]] = {name: [] for name in loops}
        for round_ in range(rounds):
            for name in (("c", "python") if round_ % 2 == 0 else ("python", "c")):
                buffers = []
                for _ in range(per_round):
                    began = time.perf_counter()
                    buffers.append(device._encode(loops[name]))
                    times[name].append(time.perf_counter() - began)
                device._device.queue.submit(buffers)
                await device.read_mapped(*read)          # the GPU idle before the next round
        median = {name: statistics.median(samples) * 1e6 for name, samples in times.items()}
        return {"model": pathlib.Path(path).name, "dispatches": len(recording.dispatches),
                "adapter": adapter, "host": platform.platform(), "date": time.strftime("%Y-%m-%d"),
                "rounds": rounds, "per_round": per_round, "library": device.replay.name,
                "encode_us": {name: round(value, 1) for name, value in median.items()},
                "per_dispatch_us": {name: round(value / len(recording.dispatches), 3) for name, value in median.items()},
                "c_over_python": round(median["c"] / median["python"], 3)}
    finally:
        backend.release()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--per-round", type=int, default=25)
    ap.add_argument("--out")
    args = ap.parse_args()
    result = asyncio.run(measure(args.model, args.rounds, args.per_round))
    print(json.dumps(result, indent=1))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
