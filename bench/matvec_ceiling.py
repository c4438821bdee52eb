"""Where the q4 decode mat-vec's time goes: the same launch with parts of its work taken away.

    PYTHONPATH=py python bench/matvec_ceiling.py --out bench/results/matvec_ceiling_<tag>.json
    PYTHONPATH=py python bench/matvec_ceiling.py --quick            # software adapters: runs, no meaning

The engine's q4 mat-vec (shaders/matvec_main.wgsl + matvec_q4.wgsl, "min" form, blocks of 32,
f16 scales and mins) reaches 0.3-0.5 of the copy bandwidth on the H200. This probe asks why, by
timing kernels that share its launch (a workgroup owns ROWS rows, its WG lanes stride over the
row's 16-byte units) but do less or do it differently:

    full      the engine's work: f32 activations loaded per unit, nibbles decoded to f32, scale and
              min applied (a copy of matvec_q4's arithmetic, written out here per row)
    no-x      the same arithmetic on activations made from the lane index: no activation loads
    loads     codes, scales and mins loaded and XORed: no arithmetic, no activations
    codes     the codes alone, XORed: the floor of this access pattern
    shared-x  `full`, the activations staged once per workgroup in workgroup memory (K <= 8192)
    int8-x    activations quantized beforehand (bytes + a scale and a sum per unit, 40 bytes a
              unit instead of 128) and dot4I8Packed: llama.cpp's mmvq arithmetic
    pairs     `full` with two adjacent units per lane per step (32 contiguous bytes a row)

Each is timed as the engine runs it: dispatches in a chain, each reading weights from its own
copy (the copies together >= 256 MiB, past the L2) and all writing one y, so that wgpu puts a
barrier between them (a dependent dispatch, as in a decode step). Beside them, in the same run,
a copy kernel moving the same bytes timed the same way. The kernels are this probe's own (like
bench/dispatch_floor.py): they only measure; the engine's kernels are shaders/*.wgsl.
Correctness: `full`, `shared-x`, `pairs` and `int8-x` are compared with numpy on the whole y.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time

import numpy as np
import wgpu

MiB = 1 << 20
SHAPES = {"llama8b gate 14336x4096": (14336, 4096), "llama8b gate+up 28672x4096": (28672, 4096),
          "llama8b down 4096x14336": (4096, 14336), "llama1b gate+up 16384x2048": (16384, 2048),
          "llama1b down 2048x8192": (2048, 8192)}
QUICK_SHAPES = {"small 256x512": (256, 512)}
MODES = ("full", "no-x", "loads", "codes", "shared-x", "int8-x", "pairs")

HEADER = """
struct Params { rows: u32, units: u32, blocks: u32, cols: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> codes: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> scales: array<u32>;
@group(0) @binding(3) var<storage, read> mins: array<u32>;
@group(0) @binding(4) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
const WG: u32 = {WG}u;
const ROWS: u32 = {ROWS}u;
const MAGIC_BITS: u32 = 0x4B000000u;
const MAGIC: f32 = 8388608.0;
fn q4_low(w: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(((vec4<u32>(w) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) | vec4<u32>(MAGIC_BITS)) - vec4<f32>(MAGIC);
}
fn q4_high(w: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>(((vec4<u32>(w) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) | vec4<u32>(MAGIC_BITS)) - vec4<f32>(MAGIC);
}
fn half_at(index: u32, word: u32) -> f32 {     // element `index` of an f16 array; word = its u32
    let pair = unpack2x16float(word);
    return select(pair.x, pair.y, (index & 1u) == 1u);
}
var<workgroup> partial: array<f32, ROWS * WG>;
"""

# One unit of f32 activations for the `full`-like modes: 8 quads and their sum.
X_GLOBAL = """
fn x_unit(u: u32) -> array<vec4<f32>, 8> {
    var q: array<vec4<f32>, 8>;
    for (var j = 0u; j < 8u; j++) { q[j] = x[u * 8u + j]; }
    return q;
}
"""
X_NONE = """
fn x_unit(u: u32) -> array<vec4<f32>, 8> {
    var q: array<vec4<f32>, 8>;
    let base = f32(u & 7u) * 0.125;
    for (var j = 0u; j < 8u; j++) { q[j] = vec4<f32>(base, base + 0.25, base - 0.5, f32(j) * 0.03); }
    return q;
}
"""
X_SHARED = """
var<workgroup> xs: array<vec4<f32>, 2048>;
fn stage_x(lane: u32) {
    for (var i = lane; i < params.units * 8u; i += WG) { xs[i] = x[i]; }
    workgroupBarrier();
}
fn x_unit(u: u32) -> array<vec4<f32>, 8> {
    var q: array<vec4<f32>, 8>;
    for (var j = 0u; j < 8u; j++) { q[j] = xs[u * 8u + j]; }
    return q;
}
"""

ROW_FULL = """
fn row_dot(q: array<vec4<f32>, 8>, total: f32, u: u32, row: u32) -> f32 {
    let c = codes[row * params.units + u];
    let cx = (dot(q4_low(c.x), q[0]) + dot(q4_high(c.x), q[1])) + (dot(q4_low(c.y), q[2]) + dot(q4_high(c.y), q[3]))
           + (dot(q4_low(c.z), q[4]) + dot(q4_high(c.z), q[5])) + (dot(q4_low(c.w), q[6]) + dot(q4_high(c.w), q[7]));
    let b = row * params.blocks + u;
    return half_at(b, scales[b >> 1u]) * cx + half_at(b, mins[b >> 1u]) * total;
}
"""


def kernel_source(mode: str, wg: int, rows: int) -> str:
    """The WGSL of one probe kernel: rows written out (ROWS is small), partial sums reduced
    through workgroup memory (the same for every mode, so it cancels in the comparison)."""
    src = HEADER.replace("{WG}", str(wg)).replace("{ROWS}", str(rows))
    if mode in ("full", "pairs"):
        src += X_GLOBAL + ROW_FULL
    elif mode == "no-x":
        src += X_NONE + ROW_FULL
    elif mode == "shared-x":
        src += X_SHARED + ROW_FULL
    elif mode == "int8-x":
        src += """
@group(0) @binding(6) var<storage, read> xq: array<vec4<u32>>;   // [units][2]: even bytes, odd bytes
@group(0) @binding(7) var<storage, read> xd: array<vec2<f32>>;   // [units]: scale d, sum of x
fn row_dot8(even: vec4<u32>, odd: vec4<u32>, d: vec2<f32>, u: u32, row: u32) -> f32 {
    let c = codes[row * params.units + u];
    let lo = c & vec4<u32>(0x0F0F0F0Fu);
    let hi = (c >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
    let s = (dot4I8Packed(lo.x, even.x) + dot4I8Packed(hi.x, odd.x)) + (dot4I8Packed(lo.y, even.y) + dot4I8Packed(hi.y, odd.y))
          + (dot4I8Packed(lo.z, even.z) + dot4I8Packed(hi.z, odd.z)) + (dot4I8Packed(lo.w, even.w) + dot4I8Packed(hi.w, odd.w));
    let b = row * params.blocks + u;
    return half_at(b, scales[b >> 1u]) * (d.x * f32(s)) + half_at(b, mins[b >> 1u]) * d.y;
}
"""
    lines = ["@compute @workgroup_size(WG)",
             "fn main(@builtin(workgroup_id) g: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>, "
             "@builtin(local_invocation_index) lane: u32) {",
             "    let first = (g.x + g.y * n.x) * ROWS;",
             "    let last = params.rows - 1u;"]
    if mode == "shared-x":
        lines.append("    stage_x(lane);")
    lines.append("    if (first >= params.rows) { return; }")
    for r in range(rows):
        lines.append(f"    var s{r} = 0.0;" if mode not in ("loads", "codes") else f"    var s{r} = 0u;")
    step = "2u * WG" if mode == "pairs" else "WG"
    start = "2u * lane" if mode == "pairs" else "lane"
    lines.append(f"    for (var u = {start}; u < params.units; u += {step}) {{")
    if mode in ("full", "no-x", "shared-x", "pairs"):
        lines.append("        let q = x_unit(u);")
        lines.append("        let total = dot(((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7])), vec4<f32>(1.0));")
        for r in range(rows):
            lines.append(f"        s{r} += row_dot(q, total, u, min(first + {r}u, last));")
        if mode == "pairs":
            lines.append("        if (u + 1u < params.units) {")
            lines.append("            let q2 = x_unit(u + 1u);")
            lines.append("            let total2 = dot(((q2[0] + q2[1]) + (q2[2] + q2[3])) + ((q2[4] + q2[5]) + (q2[6] + q2[7])), vec4<f32>(1.0));")
            for r in range(rows):
                lines.append(f"            s{r} += row_dot(q2, total2, u + 1u, min(first + {r}u, last));")
            lines.append("        }")
    elif mode == "int8-x":
        lines.append("        let even = xq[2u * u]; let odd = xq[2u * u + 1u]; let d = xd[u];")
        for r in range(rows):
            lines.append(f"        s{r} += row_dot8(even, odd, d, u, min(first + {r}u, last));")
    else:
        for r in range(rows):
            row = f"min(first + {r}u, last)"
            lines.append(f"        let c{r} = codes[{row} * params.units + u];")
            lines.append(f"        s{r} ^= (c{r}.x ^ c{r}.y) ^ (c{r}.z ^ c{r}.w);")
            if mode == "loads":
                lines.append(f"        s{r} ^= scales[({row} * params.blocks + u) >> 1u] ^ mins[({row} * params.blocks + u) >> 1u];")
    lines.append("    }")
    for r in range(rows):
        value = f"s{r}" if mode not in ("loads", "codes") else f"f32(s{r} & 1023u)"
        lines.append(f"    partial[{r}u * WG + lane] = {value};")
    lines += ["    workgroupBarrier();",
              "    if (lane < ROWS && first + lane < params.rows) {",
              "        var t = 0.0;",
              "        for (var i = 0u; i < WG; i++) { t += partial[lane * WG + i]; }",
              "        // every mode binds x, scales and mins (auto layouts drop unused bindings)",
              "        y[first + lane] = t + 0.0 * (x[0].x + f32(scales[0] & mins[0] & 1u));",
              "    }",
              "}"]
    return src + "\n".join(lines) + "\n"


COPY = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = id.x + id.y * n.x * 256u;
    if (i < arrayLength(&src)) { dst[i] = src[i]; }
}
"""


def q4_weights(rng, rows: int, cols: int):
    """Random q4 "min" weights, blocks of 32, f16 scales and mins: codes as words, and the
    dequantized weights as two parts, scale * code and min."""
    blocks = cols // 32
    c = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    scale = (rng.random((rows, blocks)) * 0.02 + 0.001).astype(np.float16)
    mn = (-(rng.random((rows, blocks)) * 0.1)).astype(np.float16)
    # a unit's word w holds codes 8w..8w+7, low nibble first: code k of a word at bits 4k
    words = np.zeros((rows, cols // 8), np.uint32)
    for k in range(8):
        words |= c[:, k::8].astype(np.uint32) << np.uint32(4 * k)
    scaled = (c.reshape(rows, blocks, 32) * scale[:, :, None].astype(np.float32)).reshape(rows, cols)
    offsets = np.repeat(mn.astype(np.float32), 32, axis=1)
    return words, scale, mn, scaled, offsets


def int8_activations(x: np.ndarray):
    """x [cols] as the int8-x mode reads it: per 32, bytes q (even / odd codes' order) and (d, sum)."""
    units = x.reshape(-1, 32).astype(np.float64)
    amax = np.abs(units).max(axis=1)
    d = np.where(amax > 0, amax / 127.0, 1.0)
    q = np.clip(np.rint(units / d[:, None]), -127, 127).astype(np.int8)
    even = np.ascontiguousarray(q[:, 0::2])   # word j: codes 8j, 8j+2, 8j+4, 8j+6
    odd = np.ascontiguousarray(q[:, 1::2])
    packed = np.stack([even.view(np.uint8).reshape(-1, 16).view(np.uint32),
                       odd.view(np.uint8).reshape(-1, 16).view(np.uint32)], axis=1).reshape(-1)
    ds = np.stack([d, units.sum(axis=1)], axis=1).astype(np.float32).reshape(-1)
    return packed, ds, (q.astype(np.float64) * d[:, None]).reshape(-1)


class Probe:
    def __init__(self, quick: bool):
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        limits = {k: adapter.limits[k] for k in ("max-storage-buffer-binding-size", "max-buffer-size",
                                                  "max-compute-workgroup-storage-size")}
        self.device = adapter.request_device_sync(required_limits=limits)
        self.adapter = adapter
        self.quick = quick
        self.usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST

    def buffer(self, data: np.ndarray | None = None, size: int | None = None):
        nbytes = data.nbytes if data is not None else size
        b = self.device.create_buffer(size=max(16, -(-nbytes // 16) * 16), usage=self.usage)
        if data is not None:
            raw = np.zeros(b.size, np.uint8)
            raw[:data.nbytes] = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
            self.device.queue.write_buffer(b, 0, raw)
        return b

    def copies(self, data: np.ndarray, count: int) -> list:
        first = self.buffer(data)
        out = [first]
        encoder = self.device.create_command_encoder()
        for _ in range(count - 1):
            b = self.device.create_buffer(size=first.size, usage=self.usage)
            encoder.copy_buffer_to_buffer(first, 0, b, 0, first.size)
            out.append(b)
        self.device.queue.submit([encoder.finish()])
        return out

    def pipeline(self, source: str):
        module = self.device.create_shader_module(code=source)
        return self.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})

    def group(self, pipeline, buffers: list):
        return self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
            {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(buffers)])

    def time_chain(self, pipeline, groups: list, grid: tuple, sync) -> dict:
        """us per dispatch of a chain cycling through `groups`, >= 5 ms a round, median of 5."""
        def run(count):
            encoder = self.device.create_command_encoder()
            compute = encoder.begin_compute_pass()
            compute.set_pipeline(pipeline)
            for i in range(count):
                compute.set_bind_group(0, groups[i % len(groups)])
                compute.dispatch_workgroups(*grid)
            compute.end()
            buffer = encoder.finish()
            self.device.queue.read_buffer(sync, 0, 4)
            started = time.perf_counter()
            self.device.queue.submit([buffer])
            self.device.queue.read_buffer(sync, 0, 4)
            return (time.perf_counter() - started) / count
        if self.quick:
            samples = [run(2) for _ in range(2)]
        else:
            warm = time.perf_counter()
            while time.perf_counter() - warm < 0.3:
                estimate = run(len(groups))
            count = max(len(groups), min(5000, int(0.005 / max(estimate, 1e-7))))
            samples = [run(count) for _ in range(5)]
        return {"us": statistics.median(samples) * 1e6, "us_min": min(samples) * 1e6, "us_max": max(samples) * 1e6}


def grid_of(workgroups: int) -> tuple:
    x = min(workgroups, 65535)
    return (x, -(-workgroups // x), 1)


def run_shape(probe: Probe, name: str, rows: int, cols: int, args) -> list[dict]:
    rng = np.random.default_rng(rows * 7 + cols)
    words, scale, mn, scaled, offsets = q4_weights(rng, rows, cols)
    dense = scaled + offsets
    x = rng.standard_normal(cols).astype(np.float32)
    xq, xd, x_rounded = int8_activations(x)
    weight_bytes = words.nbytes + scale.nbytes + mn.nbytes
    count = 1 if args.quick else max(1, -(-args.working_set_mib * MiB // weight_bytes))
    parts = [probe.copies(words, count), probe.copies(scale, count), probe.copies(mn, count)]
    xb, xqb, xdb = probe.buffer(x), probe.buffer(xq), probe.buffer(xd)
    y = probe.buffer(size=4 * rows)
    params = probe.device.create_buffer(size=16, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
    probe.device.queue.write_buffer(params, 0, np.array([rows, cols // 32, cols // 32, cols], np.uint32))
    exact = dense.astype(np.float64) @ x.astype(np.float64)
    exact_int8 = scaled.astype(np.float64) @ x_rounded + offsets.astype(np.float64) @ x   # mins meet the f32 sum
    bound = np.abs(dense).astype(np.float64) @ np.abs(x).astype(np.float64) * 1e-5 + 1e-6

    out = []
    # the copy of the same bytes (read + written = weights + x + y), in a chain like the kernels
    half = max(16, (weight_bytes + x.nbytes + 4 * rows) // 2 // 16 * 16)
    src = probe.copies(np.zeros(half // 4, np.uint32) + 7, count)
    dst = probe.buffer(size=half)
    copy = probe.pipeline(COPY)
    timing = probe.time_chain(copy, [probe.group(copy, [s, dst]) for s in src], grid_of(-(-half // 16 // 256)), dst)
    copy_gbps = 2 * half / timing["us"] / 1e3
    out.append({"shape": name, "mode": "copy", **timing, "gbps": copy_gbps})
    print(f"{name:28s} copy same bytes {timing['us']:8.2f} us {copy_gbps:7.0f} GB/s", flush=True)
    for b in src:
        b.destroy()

    for mode in args.modes:
        if mode == "shared-x" and cols > 8192:
            continue
        for wg in args.wg:
            for r in args.rows:
                if wg > max(32, cols // 32 // (2 if mode == "pairs" else 1)):
                    continue
                try:
                    pipeline = probe.pipeline(kernel_source(mode, wg, r))
                except Exception as error:          # noqa: BLE001 -- a probe reports and goes on
                    print(f"{name} {mode} WG={wg} ROWS={r}: compile failed: {error}", flush=True)
                    continue
                extra = [xqb, xdb] if mode == "int8-x" else []
                groups = [probe.group(pipeline, [params, parts[0][i], parts[1][i], parts[2][i], xb, y, *extra])
                          for i in range(count)]
                grid = grid_of(-(-rows // r))
                row = {"shape": name, "mode": mode, "WG": wg, "ROWS": r}
                if mode in ("full", "shared-x", "pairs", "int8-x"):
                    encoder = probe.device.create_command_encoder()
                    compute = encoder.begin_compute_pass()
                    compute.set_pipeline(pipeline)
                    compute.set_bind_group(0, groups[0])
                    compute.dispatch_workgroups(*grid)
                    compute.end()
                    probe.device.queue.submit([encoder.finish()])
                    got = np.frombuffer(probe.device.queue.read_buffer(y, 0, 4 * rows), np.float32)
                    want = exact_int8 if mode == "int8-x" else exact
                    err = float(np.max(np.abs(got - want) / bound))
                    row["error_over_bound"] = err
                    row["valid"] = bool(err <= 1.0)
                timing = probe.time_chain(pipeline, groups, grid, y)
                gbps = (weight_bytes + x.nbytes + 4 * rows) / timing["us"] / 1e3
                row |= {**timing, "gbps": gbps, "of_copy_same": gbps / copy_gbps}
                out.append(row)
                print(f"{name:28s} {mode:8s} WG={wg:<3d} ROWS={r:<2d} {timing['us']:8.2f} us {gbps:7.0f} GB/s "
                      f"{gbps / copy_gbps:5.2f}x copy" + (f"  err/bound {row['error_over_bound']:.3g}"
                                                          if "error_over_bound" in row else ""), flush=True)
    for b in (*[b for p in parts for b in p], xb, xqb, xdb, y, dst, params):
        b.destroy()
    return out


def main(args) -> dict:
    probe = Probe(args.quick)
    info = probe.adapter.info
    report = {"adapter": f"{info.get('device', '?')} ({info.get('backend_type', '?')})", "host": platform.platform(),
              "date": time.strftime("%Y-%m-%d"), "wgpu": wgpu.__version__, "command": " ".join(__import__("sys").argv),
              "rows": []}
    shapes = QUICK_SHAPES if args.quick else {k: v for k, v in SHAPES.items()
                                              if not args.shapes or any(s in k for s in args.shapes)}
    began = time.perf_counter()
    for name, (rows, cols) in shapes.items():
        report["rows"] += run_shape(probe, name, rows, cols, args)
        if args.out:
            args.out.write_text(json.dumps(report, indent=1))
    report["seconds"] = time.perf_counter() - began
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--shapes", type=lambda s: s.split(","))
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--wg", type=lambda s: [int(v) for v in s.split(",")], default=[32, 64, 128, 256])
    parser.add_argument("--rows", type=lambda s: [int(v) for v in s.split(",")], default=[4, 8, 16])
    parser.add_argument("--working-set-mib", type=int, default=256)
    main(parser.parse_args())
