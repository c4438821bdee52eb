"""The webslm command line.

    webslm convert SRC -o OUT.slm [--quant q4|q8|f16|f32] [--group N]
    webslm validate FILE
    webslm inspect FILE
"""
from __future__ import annotations

import argparse
import pathlib
import sys


def cmd_convert(args) -> int:
    from .convert import ConversionError
    src = pathlib.Path(args.src)
    try:
        if src.is_dir():
            from .convert.safetensors import convert_safetensors
            report = convert_safetensors(src, args.output, quant=args.quant or "q4", group=args.group)
        else:
            from .convert.gguf import convert_gguf
            report = convert_gguf(src, args.output, quant=args.quant, group=args.group)
    except ConversionError as exc:
        print(f"webslm convert: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {report.output}: {report.tensors} tensors, sha256 {report.sha256}")
    print(f"  lossless repack: {len(report.lossless)} tensors; requantized: {len(report.requantized)}")
    for name, error in sorted(report.requantized.items()):
        print(f"    {name}: max abs error {error:.3g}")
    for note in report.notes:
        print(f"  note: {note}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="webslm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    convert = sub.add_parser("convert", help="convert a GGUF file or a safetensors directory to .slm")
    convert.add_argument("src")
    convert.add_argument("-o", "--output", required=True)
    convert.add_argument("--quant", choices=["q4", "q8", "f16", "f32"],
                         help="GGUF: requantize tensors to this encoding (default: lossless repack); "
                              "safetensors: the weight encoding (default q4)")
    convert.add_argument("--group", type=int, default=None, help="quantization block size (32, 64, 128, 256)")
    convert.set_defaults(run=cmd_convert)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
