"""Admission's first look at a rule, again and again: is the adapter judged slow?

The tuning stage skips measuring on an adapter whose rule dispatch looks slower than
timing.SLOW_DISPATCH_SECONDS. That first look is a pipeline's first use right after the stage's
compiles; once on the H200 it read over the threshold and the 8B was admitted untuned (half its
decode speed). This admits each model `--rounds` times, two seconds idle between admissions (a
user's visits), and records every look (report.looks_us: a second and third appear only where
the first was slow), the tuning's source and time, and the admission's.

    PYTHONPATH=py python bench/tuning_looks.py --model llama1b.slm --model llama8b.slm --out bench/results/tuning_looks_h200.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import time

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.webgpu.native import NativeGpu


async def main(args) -> list[dict]:
    rows = []
    models = {pathlib.Path(path).stem: webslm.open_model(path) for path in args.model}
    for round_ in range(args.rounds):
        for name, model in models.items():
            started = time.perf_counter()
            session = await admit(NativeGpu(), model, AdmissionPolicy(tuning="auto"))
            report = session.tuning
            rows.append({"model": name, "round": round_, "source": report.source, "reason": report.reason,
                         "looks_us": report.looks_us, "tuning_s": round(report.seconds, 2),
                         "changed": len(report.choices), "admission_s": round(time.perf_counter() - started, 2)})
            print(json.dumps(rows[-1]), flush=True)
            session.destroy()
            await asyncio.sleep(2)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    arguments = parser.parse_args()
    pathlib.Path(arguments.out).write_text(json.dumps(asyncio.run(main(arguments)), indent=1))
