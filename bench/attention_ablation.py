"""Where decode attention's fixed latency goes: the chunk pass cut short after each phase, and
with one kind of work taken out at a time, each timed as a step runs it (attention_sweep's
chain of dependent dispatches; these variants exist only here, never in the engine).

    PYTHONPATH=py python bench/attention_ablation.py [--quick] [--out FILE]

The variants are the registry's decode_chunk source (f16 cache) edited as text:
  full               the kernel as the engine runs it
  stop after N       returns (uniformly) after phase N (1 queries into workgroup memory,
                     2 scores and their max, 3 weights, 4 weighted V sums), lane 0 first
                     writing a value made of that phase's result, so the work stays live
  no K loads, no V loads, no q loads   the cache (or query) read replaced by a value made
                     of the index: the same arithmetic, no memory access
  no exp, no atomics the weights s - m; the max not taken (m = 0)
  no barriers        every workgroupBarrier() of the entry point removed (wrong sums; time only)
  constants          WG, GW and HD4 declared `const` with the plan's values instead of
                     `override` (whether the driver unrolls the head loops either way)
The score phase rewritten (phase 2; each checked against the full kernel's output):
  vec4 sums          a key's dot product summed in a vec4, its four lanes added at the end
                     (a chain of head_dim / 4 dependent adds instead of head_dim)
  split N (wg)       N invocations a key, each over every N-th vec4 of the row, their partial
                     scores added through workgroup memory (two barriers a round of keys)
  split N (subgroup) the same, the partials added with subgroupShuffleXor
  rows at runtime    the row loop bounded by params.head_dim / 4 (not unrolled)
  small scores       the scores array 256 words instead of 2048 (1 KiB of workgroup memory, not
                     8: about 6 KiB a workgroup in all, not 13); only where a chunk fits it
Each row is us a dependent dispatch, the empty submit's round trip subtracted; "floor" is a
dispatch on the same grid that reads its params and returns.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import platform
import re
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "py"))
sys.path.insert(0, str(ROOT / "bench"))

from attention_sweep import chain_us  # noqa: E402
from kernels import open_device  # noqa: E402
from webslm.kernels import attention, runner  # noqa: E402
from webslm.kernels.registry import KERNELS, CompiledKernel  # noqa: E402
from webslm.webgpu.native import NativeGpu  # noqa: E402

MODELS = {"smollm2": (9, 3, 64), "llama1b": (32, 8, 64), "llama8b": (32, 8, 128)}
KERNEL = "attention_decode_f16"

BARRIER = "    workgroupBarrier();\n"
PHASE_ENDS = {     # the statements each phase ends with in decode_chunk, and what lane 0 keeps of it
    1: ("        atomicStore(&max_code[lane], 0u);   // below the code of every float\n    }\n"
        "    workgroupBarrier();\n", "qv[0]"),
    2: ("    score_rows(lane, w, w.n_here);          // phase 2: scores and their max\n    workgroupBarrier();\n",
        "vec4<f32>(scores[0])"),
    3: ("    weigh_scores(lane, w.n_here);           // phase 3: exp(s - m)\n    workgroupBarrier();\n",
        "vec4<f32>(scores[0])"),
    4: ("    sum_values(lane, w, w.n_here, pairs, slices);   // phase 4: weighted V sums per slice\n"
        "    workgroupBarrier();\n", "qv[0]"),
}


def _stop_after(source: str, phase: int) -> str:
    marker, kept = PHASE_ENDS[phase]
    at = source.index(marker) + len(marker)
    cut = (f"    if (params.n_groups > 0u) {{\n        if (lane == 0u) {{ out[wid] = {kept}; }}\n"
           f"        return;\n    }}\n")
    return source[:at] + cut + source[at:]


def _replace(source: str, old: str, new: str) -> str:
    if old not in source:
        raise SystemExit(f"ablation: {old!r} is no longer in {KERNEL}'s source; update the script")
    return source.replace(old, new)


def variants(source: str) -> dict[str, str]:
    entry = source.index("fn decode_chunk(")
    head, body = source[:entry], source[entry:]
    body_end = body.index("\n}\n") + 3
    decode, rest = body[:body_end], body[body_end:]
    out = {"full": source}
    for phase in (1, 2, 3, 4):
        out[f"stop after {phase}"] = head + _stop_after(decode, phase) + rest
    out["no K loads"] = _replace(source, "return vec4<f32>(k_cache[at]);", "return vec4<f32>(f32(at) * 1e-6);")
    out["no V loads"] = _replace(source, "return vec4<f32>(v_cache[at]);", "return vec4<f32>(f32(at) * 1e-6);")
    out["no q loads"] = _replace(source, "value = q[(w.head0 + g) * e4 + i % e4] * params.scale;",
                                 "value = vec4<f32>(f32(i) * params.scale);")
    out["no K, V, q loads"] = _replace(_replace(out["no K loads"], "return vec4<f32>(v_cache[at]);",
                                                "return vec4<f32>(f32(at) * 1e-6);"),
                                       "value = q[(w.head0 + g) * e4 + i % e4] * params.scale;",
                                       "value = vec4<f32>(f32(i) * params.scale);")
    out["no exp"] = _replace(source, "= exp(scores[g * params.chunk + j] - m);", "= scores[g * params.chunk + j] - m;")
    out["no atomics"] = _replace(_replace(source, "atomicMax(&max_code[g], order_code(thread_max[g]));",
                                          "scores[g] += 0.0 * thread_max[g];"),
                                 "from_order_code(atomicLoad(&max_code[g]))", "0.0")
    out["no barriers"] = head + decode.replace(BARRIER, "") + rest
    out["constants"] = lambda overrides: _as_constants(source, overrides)     # made per plan
    return out


SCORE_HEAD = "fn score_rows(lane: u32, w: ChunkWork, n_rows: u32) {\n"
SCORE_END = "// Phase 3"

VEC4_SUMS = SCORE_HEAD + """    let e4 = HD4;
    var thread_max: array<f32, 8>;
    for (var g = 0u; g < GW; g++) {
        thread_max[g] = -3.402823e38;
    }
    for (var j = lane; j < n_rows; j += WG) {
        var a: array<vec4<f32>, 8>;
        for (var g = 0u; g < GW; g++) {
            a[g] = vec4<f32>(0.0);
        }
        let row = (w.row0 + j) * e4;
        for (var c = 0u; c < e4; c++) {
            let k = cached_key(row + c);
            for (var g = 0u; g < GW; g++) {
                a[g] += qv[g * e4 + c] * k;
            }
        }
        for (var g = 0u; g < GW; g++) {
            let s = (a[g].x + a[g].y) + (a[g].z + a[g].w);
            scores[g * params.chunk + j] = s;
            thread_max[g] = max(thread_max[g], s);
        }
    }
    for (var g = 0u; g < GW; g++) {
        if (lane < n_rows) {
            atomicMax(&max_code[g], order_code(thread_max[g]));
        }
    }
}

"""

# {add} turns each invocation's partial s[g] into the key's score in the invocation with part 0.
SPLIT = """const LANES_PER_KEY: u32 = {n}u;
var<workgroup> score_parts: array<f32, 2048>;    // [GW][WG]
""" + SCORE_HEAD + """    let e4 = HD4;
    let lpk = min(LANES_PER_KEY, e4);
    let part = lane % lpk;
    var thread_max: array<f32, 8>;
    for (var g = 0u; g < GW; g++) {
        thread_max[g] = -3.402823e38;
    }
    for (var base = 0u; base < n_rows; base += WG / lpk) {      // uniform: barriers allowed
        let j = base + lane / lpk;
        let row = (w.row0 + min(j, n_rows - 1u)) * e4;
        var s: array<f32, 8>;
        for (var g = 0u; g < GW; g++) {
            s[g] = 0.0;
        }
        for (var c = part; c < e4; c += lpk) {
            let k = cached_key(row + c);
            for (var g = 0u; g < GW; g++) {
                s[g] += dot(qv[g * e4 + c], k);
            }
        }
{add}
        if (part == 0u && j < n_rows) {
            for (var g = 0u; g < GW; g++) {
                scores[g * params.chunk + j] = s[g];
                thread_max[g] = max(thread_max[g], s[g]);
            }
        }
    }
    for (var g = 0u; g < GW; g++) {
        if (part == 0u && lane / lpk < n_rows) {
            atomicMax(&max_code[g], order_code(thread_max[g]));
        }
    }
}

"""
ADD_WG = """        for (var g = 0u; g < GW; g++) {
            score_parts[g * WG + lane] = s[g];
        }
        workgroupBarrier();
        if (part == 0u) {
            for (var g = 0u; g < GW; g++) {
                var t = 0.0;
                for (var p = 0u; p < lpk; p++) {
                    t += score_parts[g * WG + lane + p];
                }
                s[g] = t;
            }
        }
        workgroupBarrier();"""
ADD_SUBGROUP = """        for (var g = 0u; g < GW; g++) {
            var t = s[g];
            for (var o = 1u; o < lpk; o *= 2u) {
                t += subgroupShuffleXor(t, o);
            }
            s[g] = t;
        }"""


def score_variants(source: str, subgroups: bool, implicit: frozenset) -> dict[str, str]:
    """The kernel with phase 2 (score_rows) replaced; each one's output is checked."""
    start, end = source.index(SCORE_HEAD), source.index(SCORE_END)

    def with_scores(text: str) -> str:
        return source[:start] + text + source[end:]
    out = {"vec4 sums": with_scores(VEC4_SUMS)}
    for n in (4, 8):
        out[f"split {n} (wg)"] = with_scores(SPLIT.replace("{n}", str(n)).replace("{add}", ADD_WG))
        if subgroups:
            text = with_scores(SPLIT.replace("{n}", str(n)).replace("{add}", ADD_SUBGROUP))
            out[f"split {n} (subgroup)"] = text if "subgroups" in implicit else "enable subgroups;\n" + text
    rows = source[start:end].replace("let e4 = HD4;", "let e4 = params.head_dim / 4u;", 1)
    out["rows at runtime"] = with_scores(rows)
    out["small scores"] = _replace(source, "const SCORE_WORDS = 2048u;", "const SCORE_WORDS = 256u;")
    return out


def _as_constants(source: str, overrides: dict) -> str:
    """The kernel with its override declarations made constants of the plan's values."""
    for name, value in overrides.items():
        source, n = re.subn(rf"override {name}: u32 = \d+u;", f"const {name}: u32 = {value}u;", source)
        if n != 1:
            raise SystemExit(f"ablation: no `override {name}` in {KERNEL}'s source; update the script")
    return source


async def compile_source(device, code: str, overrides: dict) -> CompiledKernel:
    spec = KERNELS[KERNEL]
    overrides = spec.check_overrides(overrides)
    declared = {name: value for name, value in overrides.items() if f"override {name}:" in code}
    module = device.create_shader_module(code, label="ablation")
    layout = device.create_bind_group_layout(spec.bindings, label="ablation bindings")
    pipeline = await device.create_compute_pipeline(device.create_pipeline_layout([layout]), module,
                                                    spec.entry_point, constants=declared, label="ablation")
    return CompiledKernel(spec, overrides, layout, pipeline)


async def time_model(device, name: str, heads, keys: int, codes: dict, checked: set, rng,
                     repeats: int) -> list[dict]:
    h, kv, e = heads
    shape = attention.AttentionShape(h, kv, e, max(keys, 2), "f16")
    plan = attention.plan_decode(device.limits, shape, keys - 1, chunk=max(keys, 1))    # one chunk
    k_cache = rng.standard_normal(shape.layout.elements).astype(np.float16)
    v_cache = rng.standard_normal(shape.layout.elements).astype(np.float16)
    q = rng.standard_normal(h * e).astype(np.float32)
    scratch = [(max(4, plan.scratch_acc), np.float32), (max(2, plan.scratch_ml), np.float32)]
    rows, reference = [], None
    for variant, code in codes.items():
        if variant == "small scores" and plan.chunk_pass.overrides["GW"] * plan.chunk > 256:
            continue
        code = code(plan.chunk_pass.overrides) if callable(code) else code
        kernel = await compile_source(device, code, plan.chunk_pass.overrides)
        prepared = runner.prepare(device, kernel, plan.chunk_pass.params, [q, k_cache, v_cache],
                                  [(h * e, np.float32), *scratch], plan.chunk_pass.grid)
        us = await chain_us(device, [prepared.dispatch], prepared.outputs[0][0], repeats)
        rows.append({"model": name, "keys": keys, "variant": variant, "us": round(us, 3),
                     "WG": plan.chunk_pass.overrides["WG"], "GW": plan.chunk_pass.overrides["GW"],
                     "workgroups": plan.chunk_pass.grid[0] * plan.chunk_pass.grid[1]})
        note = ""
        if variant == "full" or variant in checked:
            got = np.frombuffer(await device.read_buffer(prepared.outputs[0][0], 0, h * e * 4), np.float32)
            if variant == "full":
                reference = got.copy()
            else:
                error = float(np.max(np.abs(got - reference)))
                rows[-1]["max_error_vs_full"] = error
                note = f"  max |error| vs full {error:.2e}"
                if not error < 1e-4:
                    raise SystemExit(f"ablation: {variant} disagrees with the full kernel ({error})")
        print(f"{name:8} keys {keys:4} WG {rows[-1]['WG']:3} groups {rows[-1]['workgroups']:3} "
              f"{variant:18} {us:7.2f} us{note}", flush=True)
        prepared.release(device)
    return rows


async def main(args) -> dict:
    adapter, device = await open_device(NativeGpu())
    implicit = getattr(device, "implicit_wgsl_enables", frozenset())
    source = KERNELS[KERNEL].source(implicit)
    codes = variants(source)
    scored = score_variants(source, "subgroups" in device.features, implicit)
    codes.update(scored)
    if args.scores_only:
        codes = {"full": codes["full"], **scored}
    if args.only:
        codes = {name: codes[name] for name in ["full", *args.only.split(",")]}
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(args.rounds):
        for name, heads in MODELS.items():
            for keys in ((1, 128) if args.quick else (1, 128, 512)):
                rows += await time_model(device, name, heads, keys, codes, set(scored), rng,
                                         20 if args.quick else 200)
    report = {"adapter": adapter.summary().description, "host": platform.platform(),
              "date": time.strftime("%Y-%m-%d"), "kernel": KERNEL, "rows": rows}
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="two contexts, few repeats (software adapters)")
    parser.add_argument("--scores-only", action="store_true", help="the full kernel and the score-phase rewrites only")
    parser.add_argument("--only", help="comma-separated variants to time beside the full kernel")
    parser.add_argument("--rounds", type=int, default=1, help="times through every shape and variant")
    parser.add_argument("--out")
    asyncio.run(main(parser.parse_args()))
