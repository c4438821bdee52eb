"""What makes two compiled pipelines, or two bind groups, the same object.

PipelineKey binds every fact that can change what a compiled compute pipeline computes (the
design report, "Pipeline and bind-group identity"): the exact WGSL text compiled, its entry
point and override constants, the quantized layout it decodes, the device's features, limits
and feature level, and the runtime/engine/compiler it was compiled by. Two keys are equal
only when all of those are, so a cache keyed by it can never hand a model a pipeline built
for another shader, layout or device class. It holds buckets, never raw adapter strings or
raw limits, so a key may be logged or persisted without fingerprinting the machine.

Pipelines themselves are device objects and are never reused across devices; what a key
makes durable is the knowledge "this exact program compiled and passed its self-tests".

BindGroupKey names one bind group: the device, the pipeline layout, and for every binding
the buffer's identity *and generation*, offset and size, plus the model/session epoch. A
buffer re-created under an old name (or a recycled Python id()) after a model switch gets a
new generation from BufferIdentities, so it can never hit a bind group of the old buffer.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from typing import Any, Callable, Hashable, Iterable, Mapping

from ..artifact import format as slm_format
from ..webgpu.interface import FEATURE_LEVELS
from .receipt import feature_names, limit_profile_id, runtime_build_hash

BACKEND_ABI_VERSION = "webslm-gpu-abi-1"
# The quantization descriptor scheme kernels decode: that of the .slm format version.
QUANT_DESCRIPTOR_VERSION = f"slm-v{slm_format.VERSION}"

# The one coarse fact about the native stack a key may carry: which WebGPU implementation and
# which graphics API below it; never the adapter, vendor or driver.
NATIVE_BACKEND_CLASSES = ("browser-webgpu", "wgpu-native-vulkan", "wgpu-native-metal",
                          "wgpu-native-dx12", "wgpu-native-gl", "wgpu-native-other")


@dataclasses.dataclass(frozen=True)
class PipelineKey:
    backend_abi_version: str
    runtime_build_hash: str
    complete_wgsl_source_hash: str                 # sha256 of the exact text compiled
    entry_point: str
    specialization_constant_map: tuple[tuple[str, float], ...]   # sorted (name, value)
    quant_descriptor_version: str
    tensor_layout_profile_hash: str
    enabled_feature_bits: tuple[str, ...]          # sorted feature names of the device
    requested_limit_profile: str                   # a receipt limit profile id
    feature_level: str
    browser_engine_major_bucket: str
    coarse_native_backend_class: str
    shader_compiler_pipeline_version_if_public: str | None   # None where not public

    def __post_init__(self):
        # Sorted, immutable containers: equal facts must give equal (and hashable) keys.
        constants = self.specialization_constant_map
        if not isinstance(constants, tuple) or list(constants) != sorted(set(constants)):
            raise ValueError("specialization_constant_map must be a sorted tuple of (name, value)")
        features = self.enabled_feature_bits
        if not isinstance(features, tuple) or list(features) != sorted(set(features)):
            raise ValueError("enabled_feature_bits must be a sorted tuple of feature names")
        if self.feature_level not in FEATURE_LEVELS:
            raise ValueError(f"feature level must be one of {FEATURE_LEVELS}")
        if self.coarse_native_backend_class not in NATIVE_BACKEND_CLASSES:
            raise ValueError(f"backend class must be one of {NATIVE_BACKEND_CLASSES}")

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["specialization_constant_map"] = [list(p) for p in self.specialization_constant_map]
        data["enabled_feature_bits"] = list(self.enabled_feature_bits)
        return data

    def digest(self) -> str:
        """sha256 hex of the key's canonical JSON (sorted keys, no spaces), domain-tagged."""
        text = json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(b"webslm-pipeline-key\0" + text.encode()).hexdigest()


def pipeline_key(spec, overrides: Mapping[str, float], *, device_features: Iterable[str],
                 device_limits: Mapping[str, int], feature_level: str, browser_bucket: str,
                 backend_class: str, tensor_layout_hash: str,
                 implicit_enables: frozenset[str] = frozenset(),
                 compiler_version: str | None = None, runtime_build: str | None = None,
                 quant_version: str = QUANT_DESCRIPTOR_VERSION) -> PipelineKey:
    """The key of registry kernel `spec` (a KernelSpec) compiled with `overrides` on a device.

    implicit_enables must be what compile_kernel passes to spec.source() on that device
    (device.implicit_wgsl_enables), so the hash is of the text actually compiled."""
    overrides = spec.check_overrides(dict(overrides))
    source = spec.source(frozenset(implicit_enables))
    return PipelineKey(
        backend_abi_version=BACKEND_ABI_VERSION,
        runtime_build_hash=runtime_build or runtime_build_hash(),
        complete_wgsl_source_hash=hashlib.sha256(source.encode("utf-8")).hexdigest(),
        entry_point=spec.entry_point,
        specialization_constant_map=tuple(sorted(overrides.items())),
        quant_descriptor_version=quant_version,
        tensor_layout_profile_hash=tensor_layout_hash,
        enabled_feature_bits=feature_names(device_features),
        requested_limit_profile=limit_profile_id(device_limits),
        feature_level=feature_level,
        browser_engine_major_bucket=browser_bucket,
        coarse_native_backend_class=backend_class,
        shader_compiler_pipeline_version_if_public=compiler_version,
    )


def native_backend_class(graphics_api: str | None) -> str:
    """None (in a browser) -> "browser-webgpu"; wgpu-native's backend type ("Vulkan",
    "Metal", "D3D12", "OpenGL"/"GL") -> its class; anything else -> "wgpu-native-other"."""
    if graphics_api is None:
        return "browser-webgpu"
    api = graphics_api.strip().lower()
    for names, cls in ((("vulkan",), "wgpu-native-vulkan"), (("metal",), "wgpu-native-metal"),
                       (("d3d12", "dx12"), "wgpu-native-dx12"),
                       (("opengl", "gl", "gles"), "wgpu-native-gl")):
        if api in names:
            return cls
    return "wgpu-native-other"


def tensor_layout_profile_hash(tensors: Iterable) -> str:
    """sha256 over the distinct layouts the kernels decode: encoding and every quantization
    descriptor field that changes decoding (block size, scale type and layout, zero mode,
    signedness, nibble order). Shapes are left out: kernels take them as uniforms, and a
    shape that specializes a kernel is already an override constant in the key."""
    layouts = set()
    for tensor in tensors:
        q = tensor.quant
        layouts.add(json.dumps([tensor.encoding] + ([] if q is None else [
            q.block_elements, q.scale_type, q.scale_layout, q.zero, q.zero_offset,
            q.min_type, q.code_signedness, q.nibble_order])))
    digest = hashlib.sha256(b"webslm-tensor-layouts\0")
    for layout in sorted(layouts):
        digest.update(layout.encode() + b"\n")
    return digest.hexdigest()


# -- bind groups -------------------------------------------------------------------------------

_device_tokens = itertools.count(1)


def new_device_token() -> int:
    """A process-local token naming one GPUDevice object for as long as it lives. It is not an
    adapter identifier and is never persisted; a new device (even on the same adapter, e.g.
    after a loss) gets a new token, so none of the old device's bind groups can be found."""
    return next(_device_tokens)


@dataclasses.dataclass(frozen=True)
class BufferRef:
    buffer_id: Hashable     # the buffer's name or handle in the engine
    generation: int         # from BufferIdentities: unique per created buffer, never reused


@dataclasses.dataclass(frozen=True)
class BoundRange:
    buffer: BufferRef
    offset: int
    size: int | None        # None: to the end of the buffer (as in BufferBinding)

    def __post_init__(self):
        if self.offset < 0 or (self.size is not None and self.size <= 0):
            raise ValueError(f"bad bound range: offset {self.offset}, size {self.size}")


class BufferIdentities:
    """Issues BufferRefs. Generations come from one counter that only goes up, so a buffer
    created again under an id that an old one had (a reused variable name, a recycled Python
    id()) is a different BufferRef, and bind groups of the old buffer cannot match it."""

    def __init__(self):
        self._generations = itertools.count(1)
        self._current: dict[Hashable, BufferRef] = {}

    def issue(self, buffer_id: Hashable) -> BufferRef:
        """Call when a buffer is created under `buffer_id`."""
        ref = BufferRef(buffer_id, next(self._generations))
        self._current[buffer_id] = ref
        return ref

    def current(self, buffer_id: Hashable) -> BufferRef:
        return self._current[buffer_id]

    def retire(self, buffer_id: Hashable) -> BufferRef:
        """Call when the buffer is destroyed; returns its last ref (to invalidate caches)."""
        return self._current.pop(buffer_id)


@dataclasses.dataclass(frozen=True)
class BindGroupKey:
    device_token: int
    pipeline_layout: str                 # e.g. the pipeline key digest + ":group0"
    bindings: tuple[BoundRange, ...]     # by binding index
    epoch: int                           # model/session epoch the group belongs to


class BindGroupCache:
    """Bind groups by BindGroupKey. Entries go when their device, epoch or buffer does."""

    def __init__(self):
        self._groups: dict[BindGroupKey, Any] = {}

    def get_or_create(self, key: BindGroupKey, create: Callable[[], Any]) -> Any:
        if key not in self._groups:
            self._groups[key] = create()
        return self._groups[key]

    def invalidate(self, *, device_token: int | None = None, epoch: int | None = None,
                   buffer: BufferRef | None = None) -> int:
        """Drop every entry of this device, of this epoch, or binding this buffer generation
        (any that match); returns how many went."""
        if device_token is None and epoch is None and buffer is None:
            raise ValueError("invalidate needs a device_token, an epoch or a buffer")
        doomed = [key for key in self._groups
                  if key.device_token == device_token or key.epoch == epoch
                  or (buffer is not None and any(b.buffer == buffer for b in key.bindings))]
        for key in doomed:
            del self._groups[key]
        return len(doomed)

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, key: BindGroupKey) -> bool:
        return key in self._groups
