"""Build the CPU path's quantized matrix kernel (py/webslm/cpu/qmatmul.c) and the native
GPU path's replay loop (py/webslm/webgpu/replay.c), idempotently.

Usage: python tools/build_kernels.py [--root REPO] [--check]

Writes, next to each source, in a build/ folder (git-ignored):

    cpu/build/webslm_qmatmul.wasm        for the Pyodide worker (tools/assets.py puts it on the site)
    cpu/build/libwebslm_qmatmul.so       for CPython (webslm.cpu.kernels loads it with ctypes), from
                                         qmatmul_pool.c: qmatmul.c and a pool of threads that share a product
    webgpu/build/libwebslm_replay.so     for CPython on wgpu-native (webslm.webgpu.native loads it with
                                         ctypes): a recorded compute pass encoded in one call

Both with Debian's clang (apt: clang, lld; ./dev installs them): wasm32 with simd128 and
wasm-ld, and the host's own target. Outputs newer than the source and this script are kept.
Without clang the step says so and exits 0: the CPU path then decodes strips of rows with
numpy (slower, same memory).

The .wasm runs on Pyodide's memory (it imports it), so it must own none of it: the check
refuses a module with a data section, a memory of its own, or any use of a global (clang's
shadow stack pointer is the only global it could use). --check only verifies existing files.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = "py/webslm/cpu/qmatmul.c"
NATIVE_SOURCE = "py/webslm/cpu/qmatmul_pool.c"     # qmatmul.c and a thread pool (CPython only)
WASM = "py/webslm/cpu/build/webslm_qmatmul.wasm"
NATIVE = "py/webslm/cpu/build/libwebslm_qmatmul.so"
REPLAY_SOURCE = "py/webslm/webgpu/replay.c"
REPLAY = "py/webslm/webgpu/build/libwebslm_replay.so"
EXPORTS = ("webslm_q8_matmul", "webslm_q4_matmul", "webslm_block_sums", "webslm_prepare")
# The arithmetic is qmatmul.c's only with these: no contraction into fused multiply-adds,
# no fast-math reassociation; freestanding so that no loop turns into a libc call.
COMMON = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-ffreestanding", "-fno-builtin", "-Wall", "-Wextra", "-Werror"]
WASM_FLAGS = ["--target=wasm32", "-msimd128", "-nostdlib", "-Wl,--no-entry", "-Wl,--import-memory",
              *[f"-Wl,--export={name}" for name in EXPORTS]]


class BuildError(Exception):
    pass


def tool(*names: str) -> str | None:
    return next((path for path in map(shutil.which, names) if path), None)


def native_flags() -> list[str]:
    """AVX2 where this CPU has it (x86-64); the code uses 4-lane vectors either way."""
    try:
        flags = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        flags = ""
    return ["-mavx2"] if " avx2" in flags else []


def sections(wasm: bytes) -> list[int]:
    """The ids of a Wasm module's sections, in order."""
    if wasm[:8] != b"\0asm\x01\0\0\0":
        raise BuildError("not a Wasm module (version 1)")
    ids, at = [], 8
    while at < len(wasm):
        ids.append(wasm[at])
        at += 1
        size = shift = 0
        while True:                                 # LEB128 section size
            byte = wasm[at]
            at += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        at += size
    return ids


def check_wasm(path: pathlib.Path, objdump: str | None) -> None:
    ids = sections(path.read_bytes())
    if 11 in ids or 12 in ids:
        raise BuildError(f"{path}: has a data section: it would write into Pyodide's memory")
    if 5 in ids:
        raise BuildError(f"{path}: defines a memory of its own instead of importing Pyodide's")
    if objdump is None:
        raise BuildError("llvm-objdump is needed to check that the module uses no global (apt: llvm)")
    listing = subprocess.run([objdump, "-d", str(path)], check=True, capture_output=True, text=True).stdout
    if "global.get" in listing or "global.set" in listing:
        raise BuildError(f"{path}: uses a global (the shadow stack): it would write into Pyodide's memory")
    missing = [name for name in EXPORTS if f"<{name}>:" not in listing]
    if missing:
        raise BuildError(f"{path}: lacks {', '.join(missing)}")


def fresh(out: pathlib.Path, inputs: list[pathlib.Path]) -> bool:
    return out.is_file() and all(out.stat().st_mtime >= i.stat().st_mtime for i in inputs)


def build(root: pathlib.Path, check_only: bool = False) -> list[str]:
    """Build what is stale; returns lines saying what was done."""
    clang = tool("clang", "clang-14")
    objdump = tool("llvm-objdump", "llvm-objdump-14")
    wasm = root / WASM
    kernel = [root / SOURCE, root / NATIVE_SOURCE, pathlib.Path(__file__)]
    done = []
    if not check_only:
        if clang is None:
            return ["clang not found: no qmatmul kernel or replay loop built (the CPU path uses numpy, the "
                    "native GPU path encodes in Python; apt: clang lld)"]
        builds = ((wasm, WASM_FLAGS, root / SOURCE, kernel),
                  (root / NATIVE, [*native_flags(), "-shared", "-fPIC", "-pthread"], root / NATIVE_SOURCE, kernel),
                  (root / REPLAY, ["-shared", "-fPIC"], root / REPLAY_SOURCE,
                   [root / REPLAY_SOURCE, pathlib.Path(__file__)]))
        for out, flags, source, inputs in builds:
            out.parent.mkdir(parents=True, exist_ok=True)
            if fresh(out, inputs):
                done.append(f"{out.relative_to(root)}: up to date")
                continue
            run = subprocess.run([clang, *COMMON, *flags, "-o", str(out), str(source)], capture_output=True, text=True)
            if run.returncode:
                out.unlink(missing_ok=True)
                raise BuildError(f"clang failed for {out.name}:\n{run.stderr}")
            done.append(f"{out.relative_to(root)}: built ({out.stat().st_size} bytes)")
    if wasm.is_file():
        try:
            check_wasm(wasm, objdump)
        except BuildError:
            wasm.unlink()                  # never leave a module that could corrupt the heap
            raise
        done.append(f"{wasm.relative_to(root)}: checked (imports its memory, no data, no stack)")
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=pathlib.Path, default=ROOT)
    ap.add_argument("--check", action="store_true", help="only verify the built .wasm")
    args = ap.parse_args(argv)
    try:
        for line in build(args.root.resolve(), args.check):
            print(f"[build_kernels] {line}", file=sys.stderr)
    except BuildError as e:
        print(f"[build_kernels] {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
