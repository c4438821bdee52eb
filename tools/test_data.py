"""Fetch the test data the native tests use beyond the site's assets, idempotently.

Usage: python tools/test_data.py   (./dev test runs it)

    .assets/cache/llama_cpp_python-0.3.36.tar.gz   PyPI sdist of llama-cpp-python: llama.cpp's
        vocab-only GGUFs with tokenizer test vectors (vendor/llama.cpp/models/ggml-vocab-*),
        used by tests/test_tokenizer.py for SentencePiece, Llama-3, Qwen2 and GPT-2 parity.

Pinned by sha256 like every other download; a mismatch or an unreachable registry stops
with a one-line message (exit 2).

The archive is taken straight from the package index (its simple API, PEP 691), because
`pip download` of an sdist first installs the package's build backend in an isolated
environment to read its metadata: about 50 s of set-up for a file that downloads in one.
Where the index cannot be read that way, `pip download` fetches it as before.
"""
from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from assets import AssetError, fetch_cached, is_valid

PROJECT, VERSION = "llama-cpp-python", "0.3.36"
SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
INDEX = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")


def fetch_from_index(dest: Path) -> bool:
    """Download SDIST from the index's simple API into `dest`; True if it arrived with the
    pinned sha256 (anything else, a network error included, is False: pip tries next)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        request = urllib.request.Request(f"{INDEX}/{PROJECT}/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            files = json.load(response)["files"]
        url = next(f["url"] for f in files if f["filename"] == SDIST)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=300) as response, open(tmp, "wb") as out:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                out.write(chunk)
        if not is_valid(tmp, SDIST_SHA256):
            return False
        os.replace(tmp, dest)
        return True
    except (OSError, ValueError, KeyError, StopIteration):
        return False
    finally:
        tmp.unlink(missing_ok=True)


def main() -> int:
    cache = Path(__file__).resolve().parents[1] / ".assets" / "cache"
    if is_valid(cache / SDIST, SDIST_SHA256):
        print(f"test data: {SDIST} ok (cached)")
        return 0
    if fetch_from_index(cache / SDIST):
        print(f"test data: {SDIST} ok (downloaded from {INDEX})")
        return 0
    try:
        fetch_cached(cache / SDIST, SDIST_SHA256,
                     [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                      "-d", str(cache), f"{PROJECT}=={VERSION}"])
    except AssetError as exc:
        print(f"test data: {exc}", file=sys.stderr)
        return 2
    print(f"test data: {SDIST} ok (downloaded with pip)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
