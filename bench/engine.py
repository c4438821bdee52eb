"""Engine decode and prefill speed on a native WebGPU adapter (wgpu-native), with the copy
roofline measured on the same device in the same run.

    PYTHONPATH=py python bench/engine.py --model FILE.slm [--model ...] [--out FILE]

Per model:
- admission (cold: compile, upload, self-tests) and the executor's build, in seconds;
- prefill: a prompt of --prompt-tokens random ids (seeded), time until its argmax is read;
- decode: --new-tokens greedy steps (GPU argmax, 12 bytes read back each), tokens/s and the
  median step; chained (the executor's default: the next step is submitted before this one
  is read) and, in the same run, unchained, with the tokens compared; the engine loop
  (sampler, ledger, text) in each of ENGINE_LOOPS: chain depth 2 and 1, the next chained
  step encoded ahead or not, unchained;
- repeat 1 is cold (first use of the recorded lists); the figures are the median of the
  warm repeats after it, each preceded by reset();
- roofline: weight bytes per token (every weight is read once a step) / the copy kernel's
  bandwidth (bytes read + written) on this device = the decode tokens/s a bandwidth-bound
  engine would reach; `of_roofline` = measured / that;
- host: per decode step, the Python time to refresh the position params and to encode the
  recorded dispatches without submitting (what the CPU spends per token besides waiting).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from kernels import copy_roofline

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import GpuBackend
from webslm.backends.scores import Want
from webslm.program import fusion
from webslm.program.fusion import ALL
from webslm.webgpu.native import NativeGpu

ARGMAX = Want("argmax")


async def one_run(backend, prompt: list[int], new_tokens: int) -> dict:
    backend.reset()
    started = time.perf_counter()
    scores = await backend.prefill(prompt, ARGMAX)
    prefill = time.perf_counter() - started
    steps = []
    token = int(scores.ids[0])
    tokens = [token]
    for _ in range(new_tokens):
        began = time.perf_counter()
        scores = await backend.decode_one(token, ARGMAX)
        steps.append(time.perf_counter() - began)
        token = int(scores.ids[0])
        tokens.append(token)
    return {"prefill_s": prefill, "decode_s": sum(steps), "step_median_ms": statistics.median(steps) * 1e3,
            "tokens": tokens}


async def host_costs(backend, rounds: int = 50) -> dict:
    """Python time per decode step outside the GPU: params refresh, and encoding the
    recorded list without submitting it (native replay path); and the floor of a step: command
    buffers encoded beforehand, then per step only the submit and the 12-byte readback (what a
    step would cost if the host's work were free)."""
    forward = backend.forward
    started = time.perf_counter()
    for position in range(rounds):
        forward.set_params("decode", 1, position % forward.capacity, positional=True)
    params = (time.perf_counter() - started) / rounds
    recording = backend._recordings[("decode", False, "argmax", 1)]
    device = getattr(backend.device, "inner", backend.device)
    started = time.perf_counter()
    for _ in range(rounds):
        device._encode(recording)
    encode = (time.perf_counter() - started) / rounds
    read = backend._read("argmax", 1)
    floors = {}
    for blocking in (False, True):
        device.blocking_readback = blocking
        steps = []
        for command_buffer in [device._encode(recording) for _ in range(rounds)]:
            started = time.perf_counter()
            device._device.queue.submit([command_buffer])
            await device.read_mapped(*read)
            steps.append(time.perf_counter() - started)
        floors["blocking" if blocking else "awaited"] = statistics.median(steps) * 1e3
    device.blocking_readback = False
    return {"params_ms": params * 1e3, "encode_ms": encode * 1e3, "dispatches": len(recording.dispatches),
            "encoder": device.replay.name if device.replay else "python (webgpu/native.py)",
            "submit_and_read_ms": floors}


def profiled_position(backend, position: int) -> tuple:
    """The decode params written for `position` (the last of the timed answers) and the key of
    the recording a step there runs: the profiles below then time attention as those steps ran
    it (one pass, or chunks and the combine)."""
    forward = backend.forward
    forward.set_params("decode", 1, position, positional=True)
    backend.device.write_buffer(*forward.tables["decode"].write())
    return ("decode", not forward.single_pass_at(position), "argmax", 1)


async def profile(backend, repeats: int = 200, key=("decode", False, "argmax", 1)) -> list[dict]:
    """GPU time of each kind of dispatch in the decode step (argmax, at the position whose params
    were written last: profiled_position), or in another
    recorded list (`key`: the prefill body of a one-chunk prompt): one dispatch of that kind
    `repeats` times back to back in one command buffer encoded beforehand (each depends on the
    last through its output, as in the step), minus an empty submit's round trip, divided by
    `repeats`. The sum over the step's dispatch counts is what the step's dispatches take on
    the GPU. (An earlier version encoded through wgpu-py's wrappers inside the timed region,
    which cost ~12 us a dispatch on the host: it measured the host.)"""
    recording = backend._recordings[key]
    labels = backend.forward.labels
    counts: dict[str, list] = {}
    for dispatch in recording.dispatches:
        counts.setdefault(labels.get(id(dispatch), "?"), []).append(dispatch)
    device = getattr(backend.device, "inner", backend.device)
    read = backend._read("argmax", 1)

    copies = backend._readback_copies("decode", "argmax", 1)     # the read waits for the dispatches

    async def timed(dispatches) -> float:
        command_buffer = device._encode(device.record(dispatches, copies))
        started = time.perf_counter()
        device._device.queue.submit([command_buffer])
        await device.read_mapped(*read)
        return time.perf_counter() - started

    baseline = statistics.median([await timed([]) for _ in range(7)])
    rows = []
    for label, dispatches in counts.items():
        seconds = statistics.median([await timed([dispatches[0]] * repeats) for _ in range(5)])
        us = max(seconds - baseline, 0.0) / repeats * 1e6
        rows.append({"dispatch": label, "per_step": len(dispatches), "us": us, "step_us": us * len(dispatches)})
    rows.append({"dispatch": "(empty submit + readback)", "per_step": 1, "us": baseline * 1e6,
                 "step_us": baseline * 1e6})
    return rows


async def profile_in_step(backend, steps: int = 20, key=("decode", False, "argmax", 1)) -> list[dict]:
    """What each kind of dispatch costs the step it runs in: the decode step's whole dispatch list
    `steps` times back to back in one command buffer, against the same list with every dispatch
    of that kind left out (`profile` above times a kind alone, repeating one dispatch: a small
    weight matrix then sits in the L2 and the barriers between different kinds are not seen).
    The difference is what the step would save if the kind were free; the sum over kinds, set
    against the whole step, says how much of the step is not any one kind's own (each left-out
    kind also takes its barrier with it). The outputs of a step with a kind left out are
    garbage, which costs the same time."""
    recording = backend._recordings[key]
    labels = backend.forward.labels
    dispatches = list(recording.dispatches)
    kinds = list(dict.fromkeys(labels.get(id(d), "?") for d in dispatches))
    device = getattr(backend.device, "inner", backend.device)
    read = backend._read("argmax", 1)
    copies = backend._readback_copies("decode", "argmax", 1)

    async def timed(listed) -> float:
        command_buffer = device._encode(device.record(listed * steps, copies))
        started = time.perf_counter()
        device._device.queue.submit([command_buffer])
        await device.read_mapped(*read)
        return time.perf_counter() - started

    async def step_us(listed) -> float:
        return (statistics.median([await timed(listed) for _ in range(5)]) - baseline) / steps * 1e6

    baseline = statistics.median([await timed([]) for _ in range(7)])
    whole = await step_us(dispatches)
    rows = [{"dispatch": "(whole step)", "per_step": len(dispatches), "step_us": whole}]
    for kind in kinds:
        without = [d for d in dispatches if labels.get(id(d), "?") != kind]
        rows.append({"dispatch": kind, "per_step": len(dispatches) - len(without),
                     "step_us": whole - await step_us(without)})
    return rows


async def blocking_decode(backend, prompt: list[int], new_tokens: int) -> float:
    """Decode tokens/s with read_mapped blocking the thread (NativeDevice.blocking_readback)."""
    device = getattr(backend.device, "inner", backend.device)
    device.blocking_readback = True
    try:
        runs = [await one_run(backend, prompt, new_tokens) for _ in range(2)]
    finally:
        device.blocking_readback = False
    return new_tokens / runs[-1]["decode_s"]


async def unchained_decode(backend, prompt: list[int], new_tokens: int) -> dict:
    """Decode with greedy chaining off (every step waits for the one before it to be read
    back), side by side with the chained figure; the tokens must be the same."""
    backend.chaining = False
    try:
        runs = [await one_run(backend, prompt, new_tokens) for _ in range(2)]
    finally:
        backend.chaining = True
    return {"tokens_per_s": new_tokens / runs[-1]["decode_s"], "step_median_ms": runs[-1]["step_median_ms"],
            "tokens": runs[-1]["tokens"]}


# The engine loop's variants, side by side: (name, chaining, chain depth (None: the executor's),
# prepare the next chained step). On 2026-12-03 a fourth field compared readbacks waiting for
# their own submission (wgpuDevicePoll with its index, on a worker thread) with wgpu-py's poll
# thread: no faster chained, 5-6x slower unchained (engine_h200_wait_*.json); not kept.
ENGINE_LOOPS = (("chained", True, None, True),          # the executor's defaults
                ("chained_depth1", True, 1, True),
                ("chained_depth1_unprepared", True, 1, False),   # the chaining of 2026-12-03
                ("unchained", False, None, True))
LOOP_ROUNDS = 2     # the variants in turn, twice: a variant's figure is its best round


async def engine_decode(backend, model, prompt: list[int], new_tokens: int) -> dict:
    """Decode tokens/s through the whole engine loop (sampler, ledger, text, stop checks:
    what the CLI and the page run), for each of ENGINE_LOOPS in turn, LOOP_ROUNDS times, 2
    answers each, the second timed. A random-weight model may choose EOS early: the tokens/s
    counts what was generated."""
    from webslm.engine import Engine
    from webslm.semantic.sampler import SamplerSettings

    async def build(*_):
        return backend, {}
    engine = Engine(model, gpu=object(), build_gpu_backend=build, reuse_kv=False)
    await engine.load()
    out, defaults = {}, (backend.chain_depth, backend.prepare_chained)
    for _ in range(LOOP_ROUNDS):
        for name, chained, depth, prepare in ENGINE_LOOPS:
            backend.chaining, backend.prepare_chained = chained, prepare
            backend.chain_depth = defaults[0] if depth is None else depth
            for _ in range(2):
                ids = []
                async for delta in engine.generate(prompt, SamplerSettings(temperature=0.0, max_tokens=new_tokens),
                                                   chat=False):
                    ids.append(delta.token_id)
            t = engine.last_timings
            row = out.setdefault(name, {"rounds": [], "tokens": t.generated_tokens, "prepared": prepare,
                                        "chain_depth": backend.chain_depth if chained else 0})
            row["rounds"].append(t.generated_tokens / t.decode_seconds)
            row["tokens_per_s"] = max(row["rounds"])
    backend.chain_depth, backend.prepare_chained = defaults
    backend.chaining, backend.current_epoch = True, None    # the other figures call the backend directly
    return out


async def bench_model(path: str, args, tuning: str = "auto") -> dict:
    model = webslm.open_model(path)
    a = model.architecture
    started = time.perf_counter()
    words = [word for word in args.fusions.split(",") if word]
    fusions = None if args.fusions == "default" else ALL if args.fusions == "all" else tuple(
        rule for word in words if not word.startswith("-")
        for rule in (fusion.DEFAULT if word == "default" else (word,)) if "-" + rule not in words)
    exact = tuning == "exact"              # "exact": measured, but int8 activations not allowed
    later = tuning == "later"              # "later": admitted on the rule, measured once built (retune)
    session = await admit(NativeGpu(), model, AdmissionPolicy(context=args.context, fusions=fusions,
                                                              prefill_chunk=args.prefill_chunk,
                                                              tuning="auto" if exact or later else tuning,
                                                              tune_later=later, int8_activations=not exact,
                                                              tuning_budget_s=args.tuning_budget))
    admitted = time.perf_counter() - started
    started = time.perf_counter()
    backend = await GpuBackend.build(session, model)
    built = time.perf_counter() - started
    try:
        copy = await copy_roofline(session.device, False)
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(0, a.vocab, args.prompt_tokens)]
        deferred = None
        if later and backend.tuning_deferred:   # the first answers, on the rule; then the retune, timed
            before = [await one_run(backend, prompt, args.new_tokens) for _ in range(2)]
            started = time.perf_counter()
            report = await backend.retune(None)
            deferred = {"retune_s": round(time.perf_counter() - started, 3),
                        "before_retune": {"prefill_tokens_per_s": args.prompt_tokens / before[-1]["prefill_s"],
                                          "decode_tokens_per_s": args.new_tokens / before[-1]["decode_s"]},
                        "retune": report.summary()}
            session.tuning = report
        runs = [await one_run(backend, prompt, args.new_tokens) for _ in range(args.repeats)]
        warm = runs[1:] or runs
        weight_bytes = session.plan.as_dict()["weights_payload_bytes"]
        decode_tps = statistics.median(args.new_tokens / r["decode_s"] for r in warm)
        roofline_tps = copy["gbps"] * 1e9 / weight_bytes
        chained_stats = dict(backend.stats)
        decode_key = profiled_position(backend, args.prompt_tokens + args.new_tokens - 1) if args.profile else None
        unchained = await unchained_decode(backend, prompt, args.new_tokens)
        return {
            "model": pathlib.Path(path).name, "layers": a.n_layers, "hidden": a.hidden, "vocab": a.vocab,
            "tier": session.tier, "kv_dtype": session.plan.kv["dtype"], "context": backend.capacity,
            "fusions": list(backend.forward.programs["decode"].fusions),
            "dispatches_per_layer": backend.forward.programs["decode"].dispatches_per_layer(),
            "admission_s": round(admitted, 3), "build_s": round(built, 3),
            "admission_stages_s": dict(session.seconds),
            "self_test_family_seconds": session.self_test.get("family_seconds"),
            "tuning": session.tuning.summary() if session.tuning else None,
            "tuned_later": deferred,
            "tuning_forms": session.tuning.forms if session.tuning else None,
            "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "repeats": args.repeats,
            "prefill_chunk": backend.forward.chunk,
            "prefill_dispatches_per_layer": backend.forward.programs["prefill"].dispatches_per_layer(),
            "prefill_tokens_per_s": statistics.median(args.prompt_tokens / r["prefill_s"] for r in warm),
            "prefill_cold_s": runs[0]["prefill_s"],
            "decode_tokens_per_s": decode_tps, "decode_cold_tokens_per_s": args.new_tokens / runs[0]["decode_s"],
            "step_median_ms": statistics.median(r["step_median_ms"] for r in warm),
            "weight_bytes_per_token": weight_bytes, "copy_gbps": copy["gbps"], "copy_samples_gbps": copy["samples_gbps"],
            "roofline_tokens_per_s": roofline_tps, "of_roofline": decode_tps / roofline_tps,
            "same_tokens_every_run": all(r["tokens"] == runs[0]["tokens"] for r in runs),
            "decode_tokens_per_s_unchained": unchained["tokens_per_s"],
            "step_median_ms_unchained": unchained["step_median_ms"],
            "unchained_same_tokens": unchained["tokens"] == runs[0]["tokens"],
            "chained_stats": chained_stats,
            "engine_loop": await engine_decode(backend, model, prompt, args.new_tokens),
            "host": await host_costs(backend),
            "decode_tokens_per_s_blocking_readback": await blocking_decode(backend, prompt, args.new_tokens),
            "executor_stats": {k: v for k, v in backend.stats.items()},
            "profile": await profile(backend, key=decode_key) if args.profile else None,
            "profile_in_step": await profile_in_step(backend, key=decode_key) if args.profile else None,
            # the prefill body's dispatches (layers, final norm) of the last run, when one chunk held the prompt
            "prefill_profile": (await profile(backend, 20, ("prefill", args.prompt_tokens, True))
                                if args.profile and args.prompt_tokens <= backend.forward.chunk else None),
        }
    finally:
        backend.release()


def apply_matvec_tuning(rule: str) -> None:
    """'enc,enc=field=value,field=value': set kernels/matvec.py TUNINGS for those encodings."""
    import dataclasses
    from webslm.kernels import matvec
    encodings, _, fields = rule.partition("=")
    values = dict(item.split("=") for item in fields.split(",") if item)
    for encoding in encodings.split(","):
        base = matvec.tuning_for(encoding)
        typed = {k: type(getattr(base, k))(v) if not isinstance(getattr(base, k), bool) else v == "True"
                 for k, v in values.items()}
        matvec.TUNINGS[encoding] = dataclasses.replace(base, **typed)
        print(f"matvec tuning for {encoding}: {matvec.TUNINGS[encoding]}", flush=True)


async def main(args) -> dict:
    adapter = await NativeGpu().request_adapter("core")
    summary = adapter.summary()
    from webslm.kernels import matvec
    report = {"adapter": summary.description, "host": platform.platform(), "date": time.strftime("%Y-%m-%d"),
              "matvec_tunings": {"default": repr(matvec.TUNING)} | {e: repr(t) for e, t in matvec.TUNINGS.items()},
              "split_k": __import__("webslm.kernels.gemm_split", fromlist=["POLICY"]).POLICY,
              "rows": []}
    print(f"adapter: {summary.description}", flush=True)
    for path, tuning in ((p, t) for p in args.model for t in args.tuning.split(",")):
        row = await bench_model(path, args, tuning)
        row["tuning_mode"], row["tuning_budget_s"] = tuning, args.tuning_budget
        report["rows"].append(row)
        print(f"{row['model']} (tuning {tuning}): tier {row['tier']} prefill {row['prefill_tokens_per_s']:.0f} tok/s "
              f"({row['prompt_tokens']} tokens in chunks of {row['prefill_chunk']}), "
              f"decode {row['decode_tokens_per_s']:.1f} tok/s (cold {row['decode_cold_tokens_per_s']:.1f}; "
              f"unchained {row['decode_tokens_per_s_unchained']:.1f}, same tokens {row['unchained_same_tokens']}), "
              f"step {row['step_median_ms']:.2f} ms, roofline {row['roofline_tokens_per_s']:.0f} tok/s "
              f"({row['of_roofline']:.2f}), host params {row['host']['params_ms']:.3f} ms + encode "
              f"{row['host']['encode_ms']:.3f} ms for {row['host']['dispatches']} dispatches, "
              f"submit+read floor {row['host']['submit_and_read_ms']}, blocking readback "
              f"{row['decode_tokens_per_s_blocking_readback']:.1f} tok/s, "
              f"admission {row['admission_s']} s; engine loop decode tok/s "
              + ", ".join(f"{name} " + "/".join(f"{r:.0f}" for r in loop["rounds"])
                          for name, loop in row["engine_loop"].items()),
              flush=True)
        if row["tuned_later"]:
            t = row["tuned_later"]
            print(f"    tuned later: admission {row['admission_s']} s, before the retune prefill "
                  f"{t['before_retune']['prefill_tokens_per_s']:.0f} decode {t['before_retune']['decode_tokens_per_s']:.1f}"
                  f" tok/s; retune {t['retune_s']} s", flush=True)
        if row["tuning"]:
            t = row["tuning"]
            print(f"    tuning: {t['source']} {t['reason']} {t['seconds']} s, {t['changed']} of {t['forms']} forms "
                  f"changed", flush=True)
            for form, f in (row["tuning_forms"] or {}).items():
                print(f"      {form}: rule {f.get('rule')} {f.get('rule_us')} us -> {f.get('chosen_us')} us "
                      f"({f.get('tried')} tried)", flush=True)
        for p in row["profile"] or []:
            print(f"    {p['dispatch']:<16} x{p['per_step']:<4} {p['us']:8.2f} us  = {p['step_us'] / 1e3:.3f} ms/step")
        for p in row["profile_in_step"] or []:
            print(f"    in the step: {p['dispatch']:<16} x{p['per_step']:<4} {p['step_us'] / 1e3:.3f} ms/step")
        for p in row["prefill_profile"] or []:
            print(f"    prefill {p['dispatch']:<16} x{p['per_step']:<4} {p['us']:8.2f} us  = "
                  f"{p['step_us'] / 1e3:.3f} ms/prompt")
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", action="append", required=True, help=".slm file (repeatable)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="prefill prompt length (e.g. 128, 512)")
    parser.add_argument("--prefill-chunk", type=int, help="tokens per prefill submit (default: the planner's)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context", type=int, default=1024, help="KV capacity in tokens")
    parser.add_argument("--profile", action="store_true", help="time each kind of decode (and one-chunk "
                                                                  "prefill) dispatch")
    parser.add_argument("--fusions", default="default", help="comma-separated program/fusion.py rules, '' for "
                                                              "none, 'all' for every rule, 'default' (the default: "
                                                              "fusion.DEFAULT), also in a list: "
                                                              "'default,rope-kv-into-attention'; '-RULE' "
                                                              "leaves a rule out: 'default,-quantize-into-matmul'")
    parser.add_argument("--matvec-tuning", action="append", default=[], metavar="ENC,..=FIELD=V,..",
                        help="A/B a decode mat-vec rule: e.g. 'q4k,q6k=units_per_invocation=8,min_workgroups=1024' "
                             "(kernels/matvec.py Tuning fields) for those encodings, instead of TUNINGS")
    parser.add_argument("--split-k", default=None, help="kernels/gemm_split.py POLICY for this run: unsplit-first, "
                                                            "outer-first or off (the tile choice before split K)")
    parser.add_argument("--tuning", default="auto",
                        help="admission's mat-vec tuning stage (backends/gpu/tuning.py): auto, off or force, "
                             "later (admitted on the rule, GpuBackend.retune timed after two answers), "
                             "exact (auto without int8 activations: AdmissionPolicy.int8_activations), or "
                             "a comma list (e.g. off,auto,off,auto: each model is run once per entry, in that "
                             "order, for an A/B in one process); no cache is used, so 'auto' measures every time")
    parser.add_argument("--quantize-wg", help="kernels/matvec_prequant.py QUANTIZE_WG[,QUANTIZE_WG_NORM] for this "
                                               "run: units a quantize_x workgroup takes (32, 64, 128, 256), the "
                                               "second for the norm mode")
    parser.add_argument("--attention-split", metavar="SINGLE,MIN[,TARGET]",
                        help="decode attention's split for this run (kernels/attention.py SINGLE_PASS_MAX, "
                             "MIN_CHUNK and TARGET_WORKGROUPS): contexts up to SINGLE keys take one pass, longer "
                             "ones chunks of at least MIN keys over about TARGET workgroups")
    parser.add_argument("--tuning-budget", type=float, default=AdmissionPolicy.tuning_budget_s,
                        help="seconds the tuning stage may take (AdmissionPolicy.tuning_budget_s; also the "
                             "budget of the retune that 'later' runs)")
    parser.add_argument("--out")
    arguments = parser.parse_args()
    if arguments.quantize_wg is not None:
        from webslm.kernels import matvec_prequant
        sizes = [int(size) for size in arguments.quantize_wg.split(",")]
        matvec_prequant.QUANTIZE_WG, matvec_prequant.QUANTIZE_WG_NORM = sizes[0], sizes[-1]
    if arguments.attention_split is not None:
        from webslm.kernels import attention
        from webslm.program import ops
        split = [int(n) for n in arguments.attention_split.split(",")]
        attention.SINGLE_PASS_MAX = ops.SINGLE_PASS_MAX = split[0]
        attention.MIN_CHUNK = ops.MIN_CHUNK = split[1]
        if len(split) > 2:
            attention.TARGET_WORKGROUPS = split[2]
    for rule in arguments.matvec_tuning:
        apply_matvec_tuning(rule)
    if arguments.split_k is not None:
        from webslm.kernels import gemm_split
        if arguments.split_k not in gemm_split.POLICIES:
            parser.error(f"--split-k must be one of {gemm_split.POLICIES}")
        gemm_split.POLICY = arguments.split_k
    asyncio.run(main(arguments))
