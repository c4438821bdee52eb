"""The validator's differential fuzz at scale: 100,000 mutated files (CI runs 10,000).

    .venv/bin/python bench/fuzz_validate.py [--cases 100000] [--seed 1000] [--out bench/results/fuzz_validate.json]

Each case is tests/slm_differential.py's: a seeded mutation of the fixture model
(tests/slm_mutate.py), validated (as bytes, or streamed with the size known or unknown)
and judged by the independent oracle (tests/slm_oracle.py). Counts every outcome; "bad"
are false acceptances, false rejections, untyped exceptions and accepted models that then
failed, each with up to 10 examples (batch seed and case number reproduce them). The
figure is bad == 0; cases/s is CPU throughput on this machine, not a claim about speed.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import platform
import random
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "py")]

import slm_differential  # noqa: E402

BATCH = 1000


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1000, help="the first batch's seed (CI uses 0..9)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench/results/fuzz_validate.json")
    args = ap.parse_args(argv)
    from webslm.fixture import make_fixture
    with tempfile.TemporaryDirectory() as tmp:
        make_fixture(f"{tmp}/fixture.slm")
        base = pathlib.Path(f"{tmp}/fixture.slm").read_bytes()
    outcomes, kinds, bad = collections.Counter(), collections.Counter(), collections.defaultdict(list)
    started, cpu_started = time.perf_counter(), time.process_time()
    done = 0
    for batch in range(args.seed, args.seed + -(-args.cases // BATCH)):
        rng = random.Random(batch)
        for case in range(min(BATCH, args.cases - done)):
            result = slm_differential.run_case(rng, base)
            done += 1
            kinds[result.kind] += 1
            typed = result.outcome == "valid" or ":" not in result.outcome     # a code, or "valid"
            outcomes[result.outcome if typed else result.outcome.split(":")[0]] += 1
            if not result.good:
                label = ("false acceptance" if result.outcome == "valid" else
                         "false rejection" if typed else result.outcome.split(":")[0])
                bad[label].append(f"seed {batch} case {case}: {result}")
        print(f"{done} cases, {sum(len(v) for v in bad.values())} bad, {time.perf_counter() - started:.0f} s",
              flush=True)
    cpu = time.process_time() - cpu_started
    record = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.platform(),
              "python": platform.python_version(), "cases": done, "first_seed": args.seed,
              "bad": {k: len(v) for k, v in bad.items()}, "bad_total": sum(len(v) for v in bad.values()),
              "examples": {k: v[:10] for k, v in bad.items()}, "outcomes": dict(outcomes.most_common()),
              "mutations": dict(kinds.most_common()), "wall_seconds": round(time.perf_counter() - started, 1),
              "cpu_seconds": round(cpu, 1), "cases_per_cpu_second": round(done / cpu, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: record[k] for k in ("cases", "bad_total", "bad", "cpu_seconds", "cases_per_cpu_second")}))
    print(f"wrote {args.out}")
    return 0 if record["bad_total"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
