"""What admission derives from a manifest and a memory plan: the pipeline set, the device
limits to request, and the buffers to create with their contents.

Everything here is a pure function of (manifest, plan, device features and limits), so two
admissions of the same model on the same device compile the same pipelines and create the
same buffers in the same order.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..webgpu.interface import BufferUsage
from ..kernels.matvec_rope_kv import STORAGE_BUFFERS_ASKED
from ..kernels.registry import compile_kernel

# Limits the kernels want beyond the plan's, capped by the adapter: workgroup memory for the
# large GEMM tiles (up to 40 KiB: kernels/gemm.py TILES) and the attention tiles, 512
# invocations for the split-K GEMM tiles (256 for the other wide variants), and 9 storage
# buffers a stage for the q5k mat-vec with its norm input (six weight parts, x, the norm weight,
# the output: WebGPU's default is 8). An adapter that offers less cannot compile that kernel:
# admission then fails at "compile" and the CPU path answers. (The planner lets a q|k|v mat-vec
# take RoPE + KV append only where its fused kernel fits in as many: kernels/matvec_rope_kv.py.)
KERNEL_LIMITS = {"maxComputeWorkgroupStorageSize": 49152, "maxComputeInvocationsPerWorkgroup": 512,
                 "maxComputeWorkgroupSizeX": 512, "maxStorageBuffersPerShaderStage": STORAGE_BUFFERS_ASKED}

# Encodings the GPU kernels read (mat-vec, GEMM, embedding gather): every .slm encoding, GGUF's
# Q5_0/Q5_1 (q5) and K-quants (q4k, q5k, q6k) included (kernels/kquant.py, docs/kernels.md).
GPU_ENCODINGS = ("f32", "f16", "q8", "q4", "q5", "q4k", "q5k", "q6k")


# The families the step program (program/ops.py) expresses.
GPU_FAMILIES = ("llama", "gemma3")


def unsupported(manifest) -> str | None:
    """Why the GPU forward pass (backends/gpu/forward.py) cannot run this model, or None.
    It computes the llama block (with q/k/v biases when the model has them) and the gemma3
    block from GPU_ENCODINGS, with f32 norm and bias vectors; any other model is served by the
    CPU path, which supports the whole format."""
    a = manifest.architecture
    if a.family not in GPU_FAMILIES:
        return f"the GPU forward pass computes the {' and '.join(GPU_FAMILIES)} blocks only, not {a.family!r}"
    for name, info in manifest.tensors.items():
        if info.encoding not in GPU_ENCODINGS:
            return (f"{name} is stored as {info.encoding}, which has no GPU kernels yet "
                    f"(the GPU reads {', '.join(GPU_ENCODINGS)})")
    if a.qkv_bias and a.rope.rotary_dim != a.head_dim:
        return (f"the GPU adds q/k/v biases inside RoPE, which needs rotary_dim == head_dim "
                f"({a.rope.rotary_dim} != {a.head_dim})")
    if a.gemma3 is not None and a.gemma3.activation != "gelu-tanh":
        return f"the GPU computes GeGLU with gelu-tanh only, not {a.gemma3.activation!r}"
    for name, info in manifest.tensors.items():
        if (name.endswith("norm") or name.endswith(".bias")) and info.encoding != "f32":
            return f"{name} is stored as {info.encoding}; the GPU norm and bias kernels read f32 vectors"
    if a.hidden % 4 or a.ffn % 4:
        return f"hidden {a.hidden} and ffn {a.ffn} must be multiples of 4 (vec4 activation rows)"
    # A projection stored in different forms across the layers (llama.cpp's Q4_K_M: attn_v
    # q8 or q5, ffn_down q6k or q4k) is fine: each form has its own params slot (program/ops.py
    # weight_forms). Only a layer template that the plan cannot keep is refused (plan/memory.py).
    return None


def kernel_limits(adapter_limits: dict[str, int]) -> dict[str, int]:
    """KERNEL_LIMITS, each capped by what the adapter offers: the limits to request for a
    device that runs every kernel (the golden suite's; admission adds the plan's)."""
    return {name: min(value, adapter_limits.get(name, value)) for name, value in KERNEL_LIMITS.items()}


def device_limits(plan, adapter_limits: dict[str, int], feature_level: str = "core") -> dict[str, int]:
    """Exactly the limits to request: those where the plan needs more than WebGPU's default
    (a request below the default would be raised to it anyway), the offset alignments where
    the plan packs tighter than the default (a "min" limit is better when smaller; unrequested,
    the device keeps the default 256 and rejects the plan's offsets: Firefox's adapter offers
    less), and the kernels' wishes the adapter allows."""
    from ..plan import SPEC_DEFAULT_LIMITS
    defaults = SPEC_DEFAULT_LIMITS["compatibility" if feature_level == "compatibility" else "core"]
    wanted = {name: value for name, value in plan.required_limits.items()
              if (name.startswith("max") and value > defaults.get(name, 0))
              or (name.startswith("min") and value < defaults.get(name, value))}
    for name, value in KERNEL_LIMITS.items():
        wanted[name] = max(min(value, adapter_limits.get(name, value)), wanted.get(name, 0))
    return wanted


def pipelines(model, device, plan, choices: dict | None = None) -> list[tuple[str, dict]]:
    """Exactly the (kernel, overrides) the plan's step programs lower to on this device: every op
    of the decode program (both attention forms when the context passes the single-pass length)
    and of a prefill chunk of each length the GEMM tiles are chosen for, with each reduction the
    engine may read back. `choices`: the tuning stage's mat-vec launch shapes."""
    from ..plan.memory import plan_programs
    from ..program.lowering import Lowering
    lowering = Lowering(device, model, plan, choices)
    programs = plan_programs(model, plan)
    chosen: list[tuple[str, dict]] = []
    forms = [(0, False)] + ([(lowering.capacity - 1, True)] if lowering.decode_combine_grid is not None else [])
    for schedule, program in programs.items():
        lengths = lowering.prefill_buckets() if schedule == "prefill" else [lowering.planned_tokens(schedule)]
        reductions = [op for op in program.ops if op.kind == "reduce"]
        for tokens in lengths:
            for start, long_attention in (forms if schedule == "decode" else [(0, False)]):
                # each recording as the recorder lowers it (Lowering.lower_ops), and the
                # reductions the engine may read back instead of argmax
                launches = [launch for _, launch in lowering.lower_ops(program.ops, schedule, tokens, start,
                                                                       "argmax", long_attention)]
                launches += [launch for op in reductions
                             for launch in lowering.lower(op, schedule, tokens, start, "top-k", long_attention)]
                for launch in launches:
                    if (launch.kernel, launch.overrides) not in chosen:
                        chosen.append((launch.kernel, dict(launch.overrides)))
    return chosen


async def compile(device, name: str, overrides: dict):
    return await compile_kernel(device, name, **overrides)


def planned_buffers(plan) -> Iterator[tuple[str, int, int, list]]:
    """(name, size, usage bits, weight regions to upload) per planned buffer, in plan order.
    Buffers that receive uploads also get COPY_DST."""
    regions_by_buffer: dict[str, list] = {}
    for region in plan.regions:
        if region.source:
            regions_by_buffer.setdefault(region.buffer, []).append(region)
    for buffer in plan.buffers:
        contents = regions_by_buffer.get(buffer.name, [])
        usage = buffer.usage_bits | (BufferUsage.COPY_DST if contents else 0)
        yield buffer.name, -(-buffer.size // 4) * 4, usage, contents


def contents_chunks(model, regions: list, chunk: int) -> Iterator[tuple[int, np.ndarray]]:
    """(buffer offset, bytes) pieces of at most `chunk` bytes for each weight region, read
    from the validated artifact without copying (the last piece of a region padded to 4)."""
    manifest = model.manifest
    for region in regions:
        source = region.source
        info = manifest.tensors[source["tensor"]]
        part_offset = next(offset for part, offset, _ in info.parts if part == source["part"])
        view = uploaded_part(model, source["tensor"], source["part"])
        start = source["file_offset"] - part_offset
        data = np.frombuffer(view, np.uint8)[start:start + source["length"]]
        for begin in range(0, data.size, chunk):
            piece = data[begin:begin + chunk]
            if piece.size % 4:
                piece = np.concatenate([piece, np.zeros(4 - piece.size % 4, np.uint8)])
            yield region.offset + begin, piece


def norm_offset(model, tensor: str) -> float:
    """What the GPU adds to a stored vector before upload: Gemma 3's RMSNorm multiplies by
    (norm_weight_offset + w) (docs/slm-format.md), every norm vector of the model."""
    gemma = model.architecture.gemma3
    if gemma is None or not gemma.norm_weight_offset or not tensor.endswith("norm"):
        return 0.0
    return float(gemma.norm_weight_offset)


def uploaded_part(model, tensor: str, part: str):
    """The bytes the GPU receives for a tensor part: the artifact's, except a Gemma 3 norm
    vector, uploaded as the f32 sum w + offset. That sum is the one the CPU path computes
    (cpu/backend.py adds the offset to the dequantized f32 vector, one f32 add per element),
    so the GPU norm kernels multiply by bit-identical weights and need no offset of their own."""
    view = model.tensor_parts(tensor)[part]
    offset = norm_offset(model, tensor)
    if not offset:
        return view
    stored = np.frombuffer(view, "<f4")
    return (stored + np.float32(offset)).astype("<f4").view(np.uint8)
