"""The browser's webslm wheel (tools/assets.py: browser_wheel): everything the worker imports
is in it, nothing that only runs natively (NATIVE_ONLY) is, and its RECORD is true.

"What the worker imports" is found by reading the sources, not by running them: the worker
imports webslm.worker_api, and from there every `import` statement is followed, those inside
functions too (the worker imports most of what it uses only when a request needs it).
"""
import ast
import base64
import hashlib
import importlib.util
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("webslm_tools_assets", ROOT / "tools" / "assets.py")
assets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(assets)

WORKER_ENTRY = "webslm.worker_api"     # worker/worker.mjs: pyodide.pyimport("webslm.worker_api")


def source_modules() -> dict[str, Path]:
    """Every module of the package in the checkout: dotted name -> file."""
    modules = {}
    for path in (ROOT / "py").rglob("*.py"):
        parts = list(path.relative_to(ROOT / "py").with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports anywhere in its source, with the
    packages above each (importing a.b.c runs a and a.b first). A module that imports by name
    at run time (importlib.import_module, as webslm.kernels does its families) is taken to
    import every module below its package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            named.add(module)
            named.update(f"{module}.{alias.name}" for alias in node.names)   # `from pkg import module`
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
            named.update(m for m in modules if m.startswith(package + "."))
    found = set()
    for dotted in named:
        parts = dotted.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules)
    return found


def worker_modules() -> set[str]:
    """webslm.worker_api and every module of the package it reaches through imports."""
    modules = source_modules()
    seen, todo = set(), [WORKER_ENTRY]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(imports_of(name, modules[name], modules) - seen)
    return seen


def member_of(module: str, modules: dict[str, Path]) -> str:
    """The wheel member that holds a module: webslm/a/b.py or webslm/a/__init__.py."""
    return modules[module].relative_to(ROOT / "py").as_posix()


@pytest.fixture(scope="module")
def package_wheel(tmp_path_factory) -> bytes:
    """The package wheel as set-up builds it (pip, offline, this checkout)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(out), str(ROOT)], check=True, capture_output=True)
    (wheel,) = out.glob("webslm-*.whl")
    return wheel.read_bytes()


@pytest.fixture(scope="module")
def browser_wheel(package_wheel) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO(assets.browser_wheel(package_wheel)))


def test_the_worker_reaches_no_native_only_module():
    modules = source_modules()
    reached = {member_of(m, modules) for m in worker_modules()}
    assert not {m for m in reached if assets.is_native_only(m)}
    assert "webslm/kernels/matvec.py" in reached           # through kernels' import_module
    assert "webslm/worker/test_hooks.py" in reached         # the walk follows the facade's imports


def test_every_native_only_path_names_something_in_the_package_wheel(package_wheel):
    members = zipfile.ZipFile(io.BytesIO(package_wheel)).namelist()
    for path in assets.NATIVE_ONLY:                          # a file, or a folder ending in "/"
        assert any(m == path or (path.endswith("/") and m.startswith(path)) for m in members), path


def test_the_browser_wheel_has_what_the_worker_imports_and_nothing_native_only(browser_wheel):
    members = set(browser_wheel.namelist())
    modules = source_modules()
    missing = {member_of(m, modules) for m in worker_modules()} - members
    assert not missing, f"the worker imports these, but the browser wheel lacks them: {sorted(missing)}"
    assert not {m for m in members if assets.is_native_only(m)}
    assert not any(m.endswith(".dist-info/entry_points.txt") for m in members)   # it named webslm.cli
    assert assets.BUNDLE_JSON in members
    assert any(m.startswith("webslm/shaders/") and m.endswith(".wgsl") for m in members)


def test_the_browser_wheels_record_lists_each_member_with_its_hash(browser_wheel):
    (record,) = [m for m in browser_wheel.namelist() if m.endswith(".dist-info/RECORD")]
    listed = {}
    for line in browser_wheel.read(record).decode().splitlines():
        path, digest, _size = line.rsplit(",", 2)
        listed[path] = digest
    assert set(listed) == set(browser_wheel.namelist())
    for path, digest in listed.items():
        if path != record:                                   # RECORD does not hash itself
            data = browser_wheel.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_the_browser_wheel_is_the_same_bytes_every_time(package_wheel):
    assert assets.browser_wheel(package_wheel) == assets.browser_wheel(package_wheel)


def test_set_ups_wheel_is_the_browser_wheel():
    wheels = sorted((ROOT / ".assets" / "site" / "wheels").glob("webslm-*.whl"))
    if not wheels:
        pytest.skip("no built wheel: run `python tools/assets.py` (part of set-up) first")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        assert not [m for m in wheel.namelist() if assets.is_native_only(m)]
