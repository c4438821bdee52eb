"""The webslm command line.

    webslm convert SRC -o OUT.slm [--quant q4|q8|f16|f32] [--group N]
    webslm validate FILE
    webslm inspect FILE
    webslm generate --model FILE --prompt TEXT [--chat] [--backend native|cpu] [--max-tokens N] [--seed S | --greedy] [--json]
    webslm conformance --model FILE [--backend native|cpu] [--matvec auto|exact|int8|int8-1|int8-s] [--tokens N]
                       [--prompt TEXT] [--json]
    webslm admit --model FILE --backend native [--feature-level auto|core|compatibility] [--fault NAME] [--json]

Every failure is one line on stderr and a nonzero exit, never a traceback: 1 for an invalid
model file (or a conformance that did not pass), 2 for a bad argument, an unreadable file or
a request the model cannot serve (a prompt longer than its context, a chat template that
fails), 3 for anything unexpected (a bug: the line names the exception; WEBSLM_TRACEBACK=1
shows the traceback), 130 when interrupted.
"""
from __future__ import annotations

import argparse
import os
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
    except OSError as exc:
        print(f"webslm convert: cannot read or write {exc.filename or src}: {exc.strerror or exc}", file=sys.stderr)
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


def _native_gpu():
    """wgpu-native's entry point, or None when PyPI wgpu is not installed (the engine then
    reports no-webgpu and answers on the CPU path)."""
    try:
        from .webgpu.native import NativeGpu
    except ImportError:
        return None
    return NativeGpu()


def cmd_generate(args) -> int:
    """Stream committed text through the Engine: on the GPU with --backend native when
    admission allows it (continuing on the CPU if the device is lost), else on the CPU."""
    import asyncio
    import json
    from .cpu.backend import CpuBackendError
    from .engine import Engine
    from .errors import CodedError
    from .model import Model
    from .request import prompt_ids, sampler_settings

    artifact, status = _open(args.model)
    if artifact is None:
        return status
    model = Model(artifact)
    # Only what the command line sets; the model's defaults fill in the rest.
    given = {"seed": args.seed, "stop": args.stop, "temperature": 0.0 if args.greedy else args.temperature,
             "max_tokens": args.max_tokens}
    try:
        settings = sampler_settings(model, {k: v for k, v in given.items() if v is not None})
        # the prompt is refused (too long for the context, not Unicode, a template that
        # fails) before it is tokenized in full
        ids = prompt_ids(model, args.prompt, args.chat, args.system)
    except CodedError as exc:                    # e.g. --temperature -1, a 1 MB prompt
        print(f"webslm generate: {exc}", file=sys.stderr)
        return 2
    events: list[dict] = []
    engine = Engine(model, gpu=_native_gpu() if args.backend == "native" else None, on_event=events.append)
    pieces: list[str] = []

    async def run():
        await engine.load()
        if args.backend == "native" and engine.backend_kind != "gpu":
            why = engine.cpu_reason or {}
            print(f"webslm generate: on the CPU path: {why.get('code')} at {why.get('stage')}: "
                  f"{why.get('sentence')}", file=sys.stderr)
        finish = None
        try:
            async for delta in engine.generate(ids, settings):
                if args.json:
                    pieces.append(delta.text)
                else:
                    print(delta.text, end="", flush=True)
                finish = delta.finish_reason
            return finish, engine.backend_kind
        finally:
            await engine.unload()

    try:
        finish, backend = asyncio.run(run())
    except (CpuBackendError, CodedError) as exc:
        print(f"webslm generate: {exc}", file=sys.stderr)
        return 2
    timings = engine.last_timings
    if args.json:
        print(json.dumps({
            "text": "".join(pieces), "finish_reason": finish, "prompt_ids": ids,
            "token_ids": list(engine.ledger.committed_ids),
            "timings": {**vars(timings),
                        "prefill_tokens_per_s": timings.prompt_tokens / max(timings.prefill_seconds, 1e-9),
                        "decode_tokens_per_s": timings.generated_tokens / max(timings.decode_seconds, 1e-9)},
            "backend": backend, "events": events,
        }))
    else:
        print()
    return 0


def cmd_conformance(args) -> int:
    """Teacher-forced top-1 agreement of a backend with the CPU oracle (engine/conformance.py).
    Exit 0 when it passes, 1 when it does not, 2 when it could not run."""
    import asyncio
    import json
    import math
    from .admission.admit import AdmissionFailure, AdmissionPolicy
    from .backends.cpu_path import CpuPath
    from .kernels import matvec_prequant
    from .backends.scores import BackendLost
    from .engine.conformance import MARGIN_TOLERANCE, conformance
    from .engine.engine import EngineError, admit_and_build
    from .model import Model

    artifact, status = _open(args.model)
    if artifact is None:
        return status
    model = Model(artifact)
    from .errors import CodedError
    from .request import prompt_ids
    try:
        ids = prompt_ids(model, args.prompt, chat=False)
    except CodedError as exc:
        print(f"webslm conformance: {exc}", file=sys.stderr)
        return 2
    tolerance = MARGIN_TOLERANCE if args.margin_tolerance is None else args.margin_tolerance
    tuning_summary: dict = {}          # which mat-vecs ran on int8 activations (the receipt's)

    async def run():
        if args.backend == "cpu":
            backend = CpuPath(model)
        else:
            policy = {"auto": AdmissionPolicy(), "exact": AdmissionPolicy(int8_activations=False),
                      "int8": AdmissionPolicy(tuning="int8"), "int8-1": AdmissionPolicy(tuning="int8-1"),
                      "int8-s": AdmissionPolicy(tuning="int8-s")}[args.matvec]
            try:
                backend, _ = await admit_and_build(_native_gpu(), model, policy, None)
                if backend.session.tuning is not None:
                    tuning_summary.update(backend.session.tuning.summary())
            except (EngineError, AdmissionFailure, BackendLost):
                raise
            except Exception as exc:
                raise EngineError("gpu-backend-failed", "GpuBackend.build",
                                  f"the GPU executor could not be built: {type(exc).__name__}: {exc}") from exc
        try:
            return await conformance(model, backend, ids, tokens=args.tokens,
                                     margin_tolerance=tolerance)
        finally:
            backend.release()

    try:
        report = asyncio.run(run())
    except EngineError as exc:                   # no GPU executor, or it failed to build
        print(f"webslm conformance: {exc.sentence} ({exc.code})", file=sys.stderr)
        return 2
    except AdmissionFailure as failure:
        print(f"webslm conformance: not admitted: {failure.code} at stage {failure.stage}: "
              f"{failure.sentence}", file=sys.stderr)
        return 2
    except BackendLost as lost:
        print(f"webslm conformance: the device was lost: {lost.code}: {lost.sentence}", file=sys.stderr)
        return 2
    except ValueError as exc:                    # a prompt that leaves no room in the context
        print(f"webslm conformance: {exc}", file=sys.stderr)
        return 2
    int8_forms = sorted(form for form, choice in tuning_summary.get("choices", {}).items()
                        if choice.get("variant") in matvec_prequant.VARIANTS)
    report["matvec"] = {"asked": args.matvec, "int8_forms": int8_forms}
    if args.json:
        finite = lambda x: x if math.isfinite(x) else None     # noqa: E731 - JSON has no inf
        report["max_abs_logit_error"] = finite(report["max_abs_logit_error"])
        for p in report["per_position"]:
            p["max_abs_error"] = finite(p["max_abs_error"])
        print(json.dumps(report))
    else:
        print(f"{report['backend']} vs CPU oracle: {report['positions']} positions after a "
              f"{report['prompt_tokens']}-token prompt, top-1 agreement {report['top1_agreement']:.1%}, "
              f"max |logit error| {report['max_abs_logit_error']:.3g}")
        if int8_forms:
            print(f"  int8 activations on {len(int8_forms)} mat-vec form(s): {', '.join(int8_forms)}")
        for d in report["disagreements"]:
            print(f"  position {d['position']}: oracle {d['oracle_token']}, backend {d['backend_token']}, "
                  f"oracle margin {d['margin']:.4g}")
        verdict = "passed" if report["passed"] else "FAILED"
        print(f"{verdict}: every disagreement must have an oracle margin below {report['margin_tolerance']}")
    return 0 if report["passed"] else 1


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


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument as one line (argparse prints its usage first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv=None) -> int:
    parser = _Parser(prog="webslm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

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
    generate.add_argument("--backend", choices=["native", "cpu"], default="cpu",
                          help="native: the GPU through wgpu-native when admitted, else the CPU path")
    generate.add_argument("--max-tokens", type=int, default=None,
                          help="the most tokens to generate (default: the model's max_new_tokens)")
    pick = generate.add_mutually_exclusive_group()
    pick.add_argument("--greedy", action="store_true", help="always the most likely token")
    pick.add_argument("--seed", type=int, default=0, help="sampling seed (the model's defaults otherwise)")
    generate.add_argument("--temperature", type=float, default=None)
    generate.add_argument("--stop", action="append", default=[], help="a stop sequence (repeatable)")
    generate.add_argument("--json", action="store_true", help="print token ids and timings as JSON")
    generate.set_defaults(run=cmd_generate)

    conform = sub.add_parser("conformance", help="teacher-forced top-1 agreement of a backend with the CPU oracle")
    conform.add_argument("--model", required=True)
    conform.add_argument("--backend", choices=["native", "cpu"], default="native")
    conform.add_argument("--matvec", choices=["auto", "exact", "int8", "int8-1", "int8-s"], default="auto",
                         help="the GPU's decode mat-vecs: as admission chooses (auto), exact f32 activations "
                              "only, or int8 activations on every form that has them, two bytes (int8) or "
                              "one (int8-1) an activation, or two with the norm forms' 1/rms from the units' "
                              "squares (int8-s) (their numerics judged)")
    conform.add_argument("--tokens", type=int, default=128, help="positions to compare (capped by the context)")
    conform.add_argument("--prompt", default="The quick brown fox jumps over the lazy dog.")
    conform.add_argument("--margin-tolerance", type=float, default=None,
                         help="excuse a disagreement where the oracle's top-2 margin is below this "
                              "(default: engine/conformance.py MARGIN_TOLERANCE)")
    conform.add_argument("--json", action="store_true")
    conform.set_defaults(run=cmd_conformance)

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
    except KeyboardInterrupt:
        print(f"webslm {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:         # a bug still ends in one line
        if os.environ.get("WEBSLM_TRACEBACK"):
            raise
        text = " ".join(str(exc).split())[:300]
        print(f"webslm {args.command}: unexpected {type(exc).__name__}: {text} "
              "(a bug: WEBSLM_TRACEBACK=1 shows where)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
