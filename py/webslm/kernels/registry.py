"""The kernel registry: one entry per compiled kernel variant, and the only way kernels get compiled.

An entry names its WGSL sources in the bundle (concatenated in order, so a family can share
a trusted helper file such as `common_quant.wgsl`), its entry point, its bindings (kind per
binding index, in WGSL order), the override constants it accepts with their allowed values,
and the device features it needs ("subgroups", "shader-f16") or the WGSL language features
("packed_4x8_integer_dot_product"). Specialization happens only
through those overrides and the choice among registered variants; nothing here builds WGSL
from input.

Each family module (matvec.py, norm.py, ...) calls `register(...)` when imported; the
package's __init__ imports every family, so KERNELS is complete once `webslm.kernels` is.
"""
from __future__ import annotations

import dataclasses

from .. import shader_bundle
from ..webgpu.interface import Device


class KernelError(ValueError):
    """A kernel was asked for with an unknown name, an override outside its allowlist, or on
    a device that lacks a feature the kernel needs."""


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    name: str
    sources: tuple[str, ...]                      # files in the shader bundle, concatenated
    entry_point: str
    bindings: tuple[str, ...]                     # binding kinds of group 0, by index
    overrides: dict[str, tuple[int, ...]]         # name -> allowed values
    requires: frozenset[str] = frozenset()        # device features the WGSL enables, and
                                                  # WGSL language features it uses (LANGUAGE_FEATURES)

    def check_overrides(self, values: dict[str, int]) -> dict[str, int]:
        for name, value in values.items():
            allowed = self.overrides.get(name)
            if allowed is None:
                raise KernelError(f"{self.name}: no override constant named {name!r}")
            if value not in allowed:
                raise KernelError(f"{self.name}: {name}={value!r} is not one of {allowed}")
        return dict(values)

    def runs_on(self, features: frozenset[str] | set[str]) -> bool:
        return self.requires <= set(features)

    def source(self, implicit_enables: frozenset[str] = frozenset()) -> str:
        """The WGSL text. Files that only hold an `enable` directive (ENABLE_FILES) are left
        out for an implementation that provides the extension implicitly: naga (wgpu-native)
        rejects `enable subgroups;` yet accepts subgroup builtins on a device created with
        the feature, while browsers require the directive."""
        bundle = shader_bundle.load()
        return "\n".join(bundle.source(name) for name in self.sources
                         if ENABLE_FILES.get(name) not in implicit_enables)


# The optional device features any kernel may require (KernelSpec.requires): a device created
# with those of them its adapter offers can run every variant of every tier.
KERNEL_FEATURES = frozenset({"shader-f16", "subgroups"})

# WGSL language features a kernel may use (KernelSpec.requires): not device features (nothing
# to request), but what the implementation's WGSL compiler accepts. Browsers list theirs in
# navigator.gpu.wgslLanguageFeatures; a device reports them as `wgsl_language_features`.
LANGUAGE_FEATURES = frozenset({"packed_4x8_integer_dot_product"})


def capabilities(device: Device) -> frozenset[str]:
    """What a device offers kernels: its features and the WGSL language features its compiler
    accepts (devices without the attribute offer none)."""
    return frozenset(device.features) | frozenset(getattr(device, "wgsl_language_features", ()))


# Prelude files holding one `enable` directive -> the WGSL extension they enable.
ENABLE_FILES = {"enable_subgroups.wgsl": "subgroups", "enable_f16.wgsl": "f16"}

# Per quantized encoding, the files with its scale helpers: scale_at (quant_scales.wgsl) and,
# for q4 and q5, min_at (quant_mins.wgsl). The kernel declares SCALE_F16 and the scales/mins
# bindings. The super-block encodings (f16 scales only) read theirs with f16_element.
QUANT_SOURCES = {"q4": ("quant_scales.wgsl", "quant_mins.wgsl"), "q8": ("quant_scales.wgsl",),
                 "q5": ("quant_scales.wgsl", "quant_mins.wgsl")}

KERNELS: dict[str, KernelSpec] = {}


def register(*specs: KernelSpec) -> None:
    for spec in specs:
        if spec.name in KERNELS:
            raise KernelError(f"kernel {spec.name!r} registered twice")
        KERNELS[spec.name] = spec


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    spec: KernelSpec
    overrides: dict[str, int]
    bind_group_layout: object
    pipeline: object


async def compile_kernel(device: Device, name: str, **overrides: int) -> CompiledKernel:
    """Compile one registry entry on a device (asynchronously, as admission requires)."""
    spec = KERNELS.get(name)
    if spec is None:
        raise KernelError(f"no kernel named {name!r}; known: {sorted(KERNELS)}")
    offered = capabilities(device)
    if not spec.runs_on(offered):
        raise KernelError(f"{name} needs {sorted(spec.requires - offered)}, "
                          f"which this device was not created with")
    overrides = spec.check_overrides(overrides)
    code = spec.source(getattr(device, "implicit_wgsl_enables", frozenset()))
    module = device.create_shader_module(code, label="+".join(spec.sources))
    layout = device.create_bind_group_layout(spec.bindings, label=f"{name} bindings")
    pipeline_layout = device.create_pipeline_layout([layout], label=f"{name} layout")
    pipeline = await device.create_compute_pipeline(
        pipeline_layout, module, spec.entry_point, constants=overrides, label=name)
    return CompiledKernel(spec, overrides, layout, pipeline)
