"""Run the kernel golden suite on the native adapter and print a summary (any machine).

    PYTHONPATH=py python tools/kernel_golden.py [--size full|quick] [--families a,b] [--model FILE] [--out FILE]

The same suite the native tests and the browser rows run (webslm.kernels.golden); used to
check the kernels on a real GPU (the lent H200) where pytest is not set up.
"""
import argparse
import asyncio
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))

from webslm.kernels import golden  # noqa: E402
from webslm.admission.pipelines import kernel_limits  # noqa: E402
from webslm.kernels.registry import KERNEL_FEATURES  # noqa: E402
from webslm.webgpu.native import NativeGpu  # noqa: E402


async def main(args) -> dict:
    adapter = await NativeGpu().request_adapter("core")
    device = await adapter.request_device(features=sorted(KERNEL_FEATURES & adapter.features),
                                          limits=kernel_limits(adapter.summary().limits))
    model = None
    if args.model:
        import webslm
        model = webslm.open_model(args.model)
    report = await golden.run_all(device, args.size, model=model,
                                  families=args.families.split(",") if args.families else None)
    report["adapter"] = adapter.summary().description
    device.destroy()
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="full", choices=("full", "quick"))
    parser.add_argument("--families")
    parser.add_argument("--model")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    report = asyncio.run(main(args))
    for name, family in report["families"].items():
        results = family["results"]
        worst = max((r["error_over_tolerance"] for r in results), default=0.0)
        failed = sum(not r["passed"] for r in results)
        print(f"{name:12s} {len(results):4d} cases  {failed:3d} failed  worst error/tolerance {worst:.3g}  {family['seconds']} s")
    for failure in report["failed"][:20]:
        print("FAILED", json.dumps(failure))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    print("adapter:", report["adapter"], "| passed" if report["passed"] else "| FAILED")
    sys.exit(0 if report["passed"] else 1)
