"""`webslm validate` and `webslm inspect`: identity and a summary on success; on a defect the
error code, where and a sentence, a non-zero exit and never a traceback."""
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def webslm(*args):
    return subprocess.run([sys.executable, "-m", "webslm.cli", *map(str, args)], capture_output=True, text=True)


def default_model():
    manifest = ROOT / ".assets/site/manifest.json"
    if not manifest.is_file():
        pytest.skip("no assets: run `python tools/assets.py` (part of set-up) first")
    entry = next(m for m in json.loads(manifest.read_text())["models"] if m["default"])
    return ROOT / ".assets/site" / entry["file"], entry


def test_validate_prints_identity(fixture_slm_path):
    result = webslm("validate", fixture_slm_path)
    assert result.returncode == 0, result.stderr
    assert "valid:" in result.stdout and "layout hash" in result.stdout


def test_validate_the_default_model_from_set_up():
    path, entry = default_model()
    result = webslm("validate", path)
    assert result.returncode == 0, result.stderr
    assert entry["artifact_sha256"] in result.stdout
    assert "30 layers" in result.stdout and "vocab 49152" in result.stdout


def test_inspect_describes_tensors_tokenizer_and_bytes():
    path, _ = default_model()
    result = webslm("inspect", path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "byte-level BPE, pre-tokenizer smollm, 49152 tokens, 48900 merges" in out
    assert "rotate-half" in out and "blk.29.ffn_down" in out and "q4/min" in out and "q8" in out
    assert "chat template 368 characters" in out


@pytest.mark.parametrize("damage, code", [
    (lambda b: b[:-1], "truncated"),
    (lambda b: b"XXXX" + b[4:], "bad-magic"),
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "file-hash"),
])
def test_validate_reports_the_code_without_a_traceback(fixture_slm, tmp_path, damage, code):
    bad = tmp_path / "bad.slm"
    bad.write_bytes(damage(fixture_slm))
    result = webslm("validate", bad)
    assert result.returncode == 1
    assert result.stderr.startswith(f"invalid: {code} at ")
    assert "Traceback" not in result.stderr


def test_unreadable_file_is_exit_2_without_a_traceback(tmp_path):
    result = webslm("inspect", tmp_path / "missing.slm")
    assert result.returncode == 2 and "Traceback" not in result.stderr
