"""The kernel registry: one entry per WGSL family, and the only way kernels get compiled.

An entry names its shader file in the bundle, its entry point, its bindings (kind per
binding index, in WGSL order) and the override constants it accepts with their allowed
values. Specialization happens only through those overrides; nothing here builds WGSL.
"""
from __future__ import annotations

import dataclasses

from .. import shader_bundle
from ..webgpu.interface import Device


class KernelError(ValueError):
    """A kernel was asked for with an unknown name or an override outside its allowlist."""


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    name: str
    shader: str                                   # file in the shader bundle
    entry_point: str
    bindings: tuple[str, ...]                     # binding kinds of group 0, by index
    overrides: dict[str, tuple[int, ...]]         # name -> allowed values

    def check_overrides(self, values: dict[str, int]) -> dict[str, int]:
        for name, value in values.items():
            allowed = self.overrides.get(name)
            if allowed is None:
                raise KernelError(f"{self.name}: no override constant named {name!r}")
            if value not in allowed:
                raise KernelError(f"{self.name}: {name}={value!r} is not one of {allowed}")
        return dict(values)


KERNELS: dict[str, KernelSpec] = {spec.name: spec for spec in [
    KernelSpec(
        name="matvec_f32",
        shader="matvec_f32.wgsl",
        entry_point="main",
        bindings=("uniform", "read-only-storage", "read-only-storage", "storage"),
        overrides={"WG": (64, 128, 256)},
    ),
]}


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
    overrides = spec.check_overrides(overrides)
    code = shader_bundle.load().source(spec.shader)
    module = device.create_shader_module(code, label=spec.shader)
    layout = device.create_bind_group_layout(spec.bindings, label=f"{name} bindings")
    pipeline_layout = device.create_pipeline_layout([layout], label=f"{name} layout")
    pipeline = await device.create_compute_pipeline(
        pipeline_layout, module, spec.entry_point, constants=overrides, label=name)
    return CompiledKernel(spec, overrides, layout, pipeline)
