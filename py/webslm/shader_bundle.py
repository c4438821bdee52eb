"""The shader bundle: every trusted WGSL source, and one hash that names them all.

Kernels are only ever compiled from these files (never from strings assembled out of
untrusted input), so the bundle hash identifies exactly what code the GPU may run. It goes
into pipeline keys and the capability receipt.

Hash definition (also in docs/architecture.md), over the files `*.wgsl` under the shader
folder, sorted by their relative POSIX path:

    sha256( for each file:  path_utf8 + b"\\0" + decimal_byte_length + b"\\0" + bytes )

Where the bundle comes from:
- an installed wheel carries `webslm/shaders/*.wgsl` and `BUNDLE.json`, the hash recorded at
  build time; loading recomputes it and raises ShaderBundleError on any difference;
- a source checkout (editable install, tests) reads `<repo>/shaders/` directly.

This module is stdlib-only: the wheel build hook loads it by file path.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib


class ShaderBundleError(RuntimeError):
    """The shader folder is missing, or its sources differ from the hash recorded at build."""


@dataclasses.dataclass(frozen=True)
class ShaderBundle:
    sources: dict[str, str]          # relative path -> WGSL text
    file_hashes: dict[str, str]      # relative path -> sha256 hex of the file's bytes
    bundle_hash: str                 # sha256 hex, see the module docstring
    origin: str                      # "wheel" (hash verified against BUNDLE.json) or "source"

    def source(self, name: str) -> str:
        try:
            return self.sources[name]
        except KeyError:
            raise ShaderBundleError(f"no shader named {name!r} in the bundle") from None


def hash_sources(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        data = files[path]
        digest.update(path.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()


def read_bundle(folder: pathlib.Path, origin: str = "source") -> ShaderBundle:
    folder = pathlib.Path(folder)
    if not folder.is_dir():
        raise ShaderBundleError(f"shader folder not found: {folder}")
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*.wgsl")}
    if not files:
        raise ShaderBundleError(f"no .wgsl files in {folder}")
    return ShaderBundle(
        sources={name: data.decode("utf-8") for name, data in files.items()},
        file_hashes={name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
        bundle_hash=hash_sources(files),
        origin=origin,
    )


def _locate() -> tuple[pathlib.Path, bool]:
    """(folder, is_wheel): the packaged shaders if present, else the checkout's shaders/."""
    packaged = pathlib.Path(__file__).parent / "shaders"
    if (packaged / "BUNDLE.json").is_file():
        return packaged, True
    return pathlib.Path(__file__).resolve().parents[2] / "shaders", False


_cached: ShaderBundle | None = None


def load() -> ShaderBundle:
    """The bundle this installation runs, verified once and cached."""
    global _cached
    if _cached is None:
        folder, is_wheel = _locate()
        bundle = read_bundle(folder, origin="wheel" if is_wheel else "source")
        if is_wheel:
            recorded = json.loads((folder / "BUNDLE.json").read_text())["bundle_hash"]
            if recorded != bundle.bundle_hash:
                raise ShaderBundleError(
                    f"shader bundle hash {bundle.bundle_hash} differs from the hash recorded "
                    f"at build time {recorded}: the packaged WGSL was modified")
        _cached = bundle
    return _cached


def bundle_hash() -> str:
    return load().bundle_hash
