"""Fetch the test data the native tests use beyond the site's assets, idempotently.

Usage: python tools/test_data.py   (./dev test runs it)

    .assets/cache/llama_cpp_python-0.3.36.tar.gz   PyPI sdist of llama-cpp-python: llama.cpp's
        vocab-only GGUFs with tokenizer test vectors (vendor/llama.cpp/models/ggml-vocab-*),
        used by tests/test_tokenizer.py for SentencePiece, Llama-3, Qwen2 and GPT-2 parity.

Pinned by sha256 like every other download; a mismatch or an unreachable registry stops
with a one-line message (exit 2).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from assets import AssetError, fetch_cached

SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"


def main() -> int:
    cache = Path(__file__).resolve().parents[1] / ".assets" / "cache"
    try:
        fetched = fetch_cached(cache / SDIST, SDIST_SHA256,
                               [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                "-d", str(cache), "llama-cpp-python==0.3.36"])
    except AssetError as exc:
        print(f"test data: {exc}", file=sys.stderr)
        return 2
    print(f"test data: {SDIST} ok ({'downloaded' if fetched else 'cached'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
