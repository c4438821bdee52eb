"""The webslm command line.

    webslm convert SRC -o OUT.slm [--quant q4|q8|f16|f32] [--group N]
    webslm validate FILE
    webslm inspect FILE
    webslm generate --model FILE --prompt TEXT [--chat] --backend cpu [--max-tokens N] [--seed S | --greedy] [--json]
    webslm admit --model FILE --backend native [--feature-level auto|core|compatibility] [--fault NAME] [--json]
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


def _open(path: str):
    """(model, None) or (None, exit status) with the reason printed: never a traceback."""
    from .artifact import ArtifactError, validate_file
    try:
        return validate_file(path), None
    except ArtifactError as exc:
        print(f"invalid: {exc.code} at {exc.where}: {exc.sentence}", file=sys.stderr)
        return None, 1
    except OSError as exc:
        print(f"cannot read {path}: {exc.strerror or exc}", file=sys.stderr)
        return None, 2


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def cmd_validate(args) -> int:
    import time
    started = time.perf_counter()
    model, status = _open(args.file)
    if model is None:
        return status
    a = model.architecture
    print(f"valid: {args.file}")
    print(f"  artifact sha256 {model.identity.artifact_sha256}")
    print(f"  layout hash     {model.identity.layout_hash}")
    print(f"  {a.family}: {a.n_layers} layers, hidden {a.hidden}, heads {a.n_heads}/{a.n_kv_heads} kv, "
          f"ffn {a.ffn}, vocab {a.vocab}, context {a.context_length}; {len(model.manifest.tensors)} tensors, "
          f"{_size(model.nbytes)}; validated in {time.perf_counter() - started:.2f} s")
    return 0


def cmd_inspect(args) -> int:
    model, status = _open(args.file)
    if model is None:
        return status
    m = model.manifest
    a = m.architecture
    print(f"{args.file}: {model.identity.artifact_sha256}")
    print(f"architecture  {a.family}, {a.n_layers} layers, hidden {a.hidden}, ffn {a.ffn}, vocab {a.vocab}, "
          f"context {a.context_length}")
    print(f"attention     {a.n_heads} query heads, {a.n_kv_heads} KV heads, head_dim {a.head_dim}, "
          f"qkv_bias {a.qkv_bias}, tied_output {a.tied_output}")
    r = a.rope
    print(f"rope          base {r.base:g}, rotary_dim {r.rotary_dim}, {r.convention}, offset {r.position_offset}; "
          f"norm_eps {a.norm_eps:g}")
    t = m.tokenizer
    kind = "byte-level BPE" if t["byte_level"] else "SentencePiece-style BPE (byte fallback)"
    print(f"tokenizer     {kind}, pre-tokenizer {t['pre_tokenizer']}, {len(t['tokens'])} tokens, "
          f"{len(t['merges'])} merges, {len(t['special_tokens'])} special; bos {t['bos_id']}, eos {list(t['eos_ids'])}, "
          f"add_bos {t['add_bos']}")
    template = m.chat_template["template"]
    print(f"chat template {len(template)} characters: {template[:72]!r}{'…' if len(template) > 72 else ''}")
    print(f"generation    {dict(m.generation)}")
    print(f"source        {dict(m.source)}")
    print()
    print(f"{'tensor':28} {'shape':>14} {'encoding':10} {'block':>5} {'bytes':>12}")
    by_encoding: dict[str, int] = {}
    for info in m.tensors.values():
        label = info.encoding + (f"/{info.quant.zero}" if info.quant and info.quant.zero != "none" else "")
        block = info.quant.block_elements if info.quant else "-"
        by_encoding[label] = by_encoding.get(label, 0) + info.nbytes
        print(f"{info.name:28} {'x'.join(map(str, info.shape)):>14} {label:10} {block:>5} {info.nbytes:>12,}")
    print()
    for label, total in sorted(by_encoding.items()):
        print(f"  {label:10} {_size(total):>10}")
    print(f"  {'file':10} {_size(model.nbytes):>10}")
    return 0


def cmd_generate(args) -> int:
    import json
    from .cpu import CpuBackend
    from .cpu.backend import CpuBackendError
    from .generate import Timings, generate, prompt_ids
    from .model import Model
    from .semantic.ledger import Ledger
    from .semantic.sampler import SamplerSettings

    artifact, status = _open(args.model)
    if artifact is None:
        return status
    model = Model(artifact)
    defaults = model.manifest.generation
    settings = SamplerSettings(
        temperature=0.0 if args.greedy else (args.temperature if args.temperature is not None else defaults["temperature"]),
        top_k=defaults["top_k"], top_p=defaults["top_p"], min_p=defaults["min_p"],
        repetition_penalty=defaults["repetition_penalty"], max_tokens=args.max_tokens,
        seed=args.seed, stop=tuple(args.stop))
    backend = CpuBackend(model)
    ids = prompt_ids(model, args.prompt, args.chat, args.system)
    timings, pieces = Timings(), []
    ledger = Ledger()
    try:
        for delta in generate(model, backend, ids, settings, ledger=ledger, timings=timings):
            if args.json:
                pieces.append(delta.text)
            else:
                print(delta.text, end="", flush=True)
            finish = delta.finish_reason
    except CpuBackendError as exc:
        print(f"webslm generate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({
            "text": "".join(pieces), "finish_reason": finish, "prompt_ids": ids,
            "token_ids": list(ledger.committed_ids),
            "timings": {**vars(timings),
                        "prefill_tokens_per_s": timings.prompt_tokens / max(timings.prefill_seconds, 1e-9),
                        "decode_tokens_per_s": timings.generated_tokens / max(timings.decode_seconds, 1e-9)},
        }))
    else:
        print()
    return 0


def cmd_admit(args) -> int:
    """Admission on the native GPU: the tier and the receipt, or the stage and code that failed."""
    import asyncio
    import json
    from .admission.admit import AdmissionFailure, AdmissionPolicy, admit
    from .admission.receipt import render_text
    from .admission.tracked import Faults
    artifact, status = _open(args.model)
    if artifact is None:
        return status
    from .model import Model
    try:
        from .webgpu.native import NativeGpu
        gpu = NativeGpu()
    except ImportError:
        gpu = None                          # no wgpu: admission fails at its entry point
    policy = AdmissionPolicy(feature_level=args.feature_level, min_tier=args.min_tier)

    async def run():
        session = await admit(gpu, Model(artifact), policy, faults=Faults.named(args.fault))
        try:
            return session.receipt, {"tier": session.tier, "features": list(session.features),
                                     "self_test_cases": session.self_test["cases"],
                                     "plan_hash": getattr(session.plan, "hash", None),
                                     "seconds": session.seconds}
        finally:
            session.destroy()
    try:
        receipt, details = asyncio.run(run())
    except AdmissionFailure as failure:
        if args.json:
            print(json.dumps({"admitted": False, "stage": failure.stage, "code": failure.code,
                              "sentence": failure.sentence, "leaked_buffers": failure.leaked_buffers,
                              "receipt": failure.receipt.as_dict()}, indent=1))
        else:
            print(f"not admitted: {failure.code} at stage {failure.stage}: {failure.sentence}", file=sys.stderr)
            print(render_text(failure.receipt))
        return 1
    if args.json:
        print(json.dumps({"admitted": True, **details, "receipt": receipt.as_dict()}, indent=1))
    else:
        print(f"admitted: tier {details['tier']} ({', '.join(details['features']) or 'f32 baseline'}), "
              f"{details['self_test_cases']} self-tests passed")
        print(render_text(receipt))
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

    validate = sub.add_parser("validate", help="validate a .slm file and print its identity")
    validate.add_argument("file")
    validate.set_defaults(run=cmd_validate)

    inspect = sub.add_parser("inspect", help="describe a .slm file: architecture, tokenizer, tensors, bytes")
    inspect.add_argument("file")
    inspect.set_defaults(run=cmd_inspect)

    generate = sub.add_parser("generate", help="generate an answer and stream it to stdout")
    generate.add_argument("--model", required=True)
    generate.add_argument("--prompt", required=True)
    generate.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    generate.add_argument("--system", default=None, help="system message (with --chat; default: the template's)")
    generate.add_argument("--backend", choices=["cpu"], default="cpu")
    generate.add_argument("--max-tokens", type=int, default=256)
    pick = generate.add_mutually_exclusive_group()
    pick.add_argument("--greedy", action="store_true", help="always the most likely token")
    pick.add_argument("--seed", type=int, default=0, help="sampling seed (the model's defaults otherwise)")
    generate.add_argument("--temperature", type=float, default=None)
    generate.add_argument("--stop", action="append", default=[], help="a stop sequence (repeatable)")
    generate.add_argument("--json", action="store_true", help="print token ids and timings as JSON")
    generate.set_defaults(run=cmd_generate)

    admit = sub.add_parser("admit", help="admit a model on the GPU: self-tests, tier and capability receipt")
    admit.add_argument("--model", required=True)
    admit.add_argument("--backend", choices=["native"], default="native")
    admit.add_argument("--feature-level", choices=["auto", "core", "compatibility"], default="auto")
    admit.add_argument("--min-tier", choices=["A", "B", "C"], default="A")
    admit.add_argument("--fault", default=None, help="inject a named fault (tests): "
                       "missing-feature, limit-too-small, allocation-failure, compile-failure, "
                       "self-test-mismatch, device-lost, cancel")
    admit.add_argument("--json", action="store_true")
    admit.set_defaults(run=cmd_admit)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:          # `webslm inspect FILE | head`: the reader left; not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
