"""The shader bundle hash: defined once, stable, sensitive to every byte and name."""
import json
import pathlib
import zipfile

import pytest

from webslm import shader_bundle
from webslm.kernels.registry import KERNELS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_hash_is_order_independent_and_sensitive_to_content_and_names():
    files = {"a.wgsl": b"fn a() {}", "b.wgsl": b"fn b() {}"}
    base = shader_bundle.hash_sources(files)
    assert shader_bundle.hash_sources(dict(reversed(files.items()))) == base
    assert shader_bundle.hash_sources({**files, "b.wgsl": b"fn b() { }"}) != base
    assert shader_bundle.hash_sources({"a.wgsl": files["a.wgsl"], "c.wgsl": files["b.wgsl"]}) != base
    # the length prefix keeps a byte moving across a file boundary from colliding
    assert shader_bundle.hash_sources({"a.wgsl": b"xy", "b.wgsl": b"z"}) != \
        shader_bundle.hash_sources({"a.wgsl": b"x", "b.wgsl": b"yz"})


def test_checkout_bundle_has_every_registered_kernel():
    bundle = shader_bundle.read_bundle(ROOT / "shaders")
    for spec in KERNELS.values():
        assert set(spec.sources) <= set(bundle.sources)
    assert bundle.bundle_hash == shader_bundle.bundle_hash()


def test_wheel_bundle_is_verified_against_its_recorded_hash(tmp_path, monkeypatch):
    packaged = tmp_path / "shaders"
    packaged.mkdir()
    (packaged / "k.wgsl").write_text("fn main() {}")
    good = shader_bundle.read_bundle(packaged).bundle_hash
    (packaged / "BUNDLE.json").write_text(json.dumps({"bundle_hash": good}))
    monkeypatch.setattr(shader_bundle, "_locate", lambda: (packaged, True))
    monkeypatch.setattr(shader_bundle, "_cached", None)
    assert shader_bundle.load().origin == "wheel"

    (packaged / "k.wgsl").write_text("fn main() { }")       # edited after the build
    monkeypatch.setattr(shader_bundle, "_cached", None)
    with pytest.raises(shader_bundle.ShaderBundleError, match="modified"):
        shader_bundle.load()


def test_built_wheel_carries_shaders_and_matching_hash():
    wheels = sorted((ROOT / ".assets" / "site" / "wheels").glob("webslm-*.whl"))
    if not wheels:
        pytest.skip("no built wheel: run `python tools/assets.py` (part of set-up) first")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        recorded = json.loads(wheel.read("webslm/shaders/BUNDLE.json"))
        files = {name[len("webslm/shaders/"):]: wheel.read(name) for name in wheel.namelist()
                 if name.startswith("webslm/shaders/") and name.endswith(".wgsl")}
    assert recorded["bundle_hash"] == shader_bundle.hash_sources(files)
    assert recorded["bundle_hash"] == shader_bundle.bundle_hash(), "wheel is older than shaders/: rerun set-up"
