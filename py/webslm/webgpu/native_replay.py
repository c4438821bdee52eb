"""A recorded compute pass encoded by one C call: the native path's decode-step encoding.

Each decode step encodes its recorded list anew (a command buffer can be submitted once).
From Python that is three cffi calls a dispatch; on lavapipe (SmolLM2, 184 dispatches) the
Python side of those calls took about as long as wgpu-native's own work, and on the lent
H200 the step was bound by this encoding (docs/RESULTS.md). `replay.c` makes the same calls
in a C loop over arrays built once per recording. It is built by tools/build_kernels.py
(clang); where it is not built, or WEBSLM_NATIVE_REPLAY=off, native.py keeps its Python
loop, which makes the same calls in the same order.

The C loop is handed wgpu-native's three entry points as the addresses of the symbols that
wgpu-py loaded, so this library links against nothing and never loads a second wgpu-native.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import pathlib
from typing import Any

LIBRARY = pathlib.Path(__file__).resolve().parent / "build" / "libwebslm_replay.so"
ENTRY_POINTS = ("wgpuComputePassEncoderSetPipeline", "wgpuComputePassEncoderSetBindGroup",
                "wgpuComputePassEncoderDispatchWorkgroups")


@dataclasses.dataclass(frozen=True)
class Commands:
    """A recorded compute pass as raw wgpu-native handles: `rows` (pipeline, bind group, x, y,
    z) for the Python loop, and the same as C arrays for the replay loop (None without it)."""
    rows: tuple[tuple, ...]
    arrays: tuple | None = None

    def __len__(self) -> int:
        return len(self.rows)


class Replay:
    """replay.c's webslm_replay, bound to the wgpu-native that wgpu-py loaded."""

    def __init__(self, path: pathlib.Path, ffi: Any, lib: Any):
        self._ffi = ffi
        self.name = path.name
        c = ctypes.CDLL(str(path)).webslm_replay
        p, handles = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        c.argtypes = [p, p, p, p, handles, handles, ctypes.POINTER(ctypes.c_uint32), ctypes.c_uint32]
        c.restype = None
        self._replay = c
        self._entry_points = [self.address(ffi.addressof(lib, name)) for name in ENTRY_POINTS]

    def address(self, pointer: Any) -> int:
        return int(self._ffi.cast("uintptr_t", pointer))

    def commands(self, rows: list[tuple]) -> Commands:
        n = len(rows)
        pipelines = (ctypes.c_void_p * n)(*[self.address(row[0]) for row in rows])
        groups = (ctypes.c_void_p * n)(*[self.address(row[1]) for row in rows])
        grids = (ctypes.c_uint32 * (3 * n))(*[v for row in rows for v in row[2:5]])
        return Commands(tuple(rows), (pipelines, groups, grids, n))

    def encode(self, pass_handle: Any, commands: Commands) -> None:
        """Every dispatch of `commands` into the open compute pass `pass_handle`."""
        self._replay(self.address(pass_handle), *self._entry_points, *commands.arrays)


@functools.cache
def load() -> Replay | None:
    """The replay loop, or None (not built, or WEBSLM_NATIVE_REPLAY=off): the Python loop."""
    if os.environ.get("WEBSLM_NATIVE_REPLAY", "").lower() == "off":
        return None
    path = pathlib.Path(os.environ.get("WEBSLM_NATIVE_REPLAY_LIB", LIBRARY))
    if not path.is_file():
        return None
    from wgpu.backends.wgpu_native._ffi import ffi, lib
    return Replay(path, ffi, lib)
