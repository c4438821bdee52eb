"""Our tokenizer against llama.cpp's own, on the two real GGUFs: Gemma 3 270M and SmolLM2.

The peer is llama.cpp built from llama-cpp-python 0.3.36's sdist (tools/build_peer.sh makes
.venv-peer/ with it; WEBSLM_LLAMA_PEER names another interpreter that imports `llama_cpp`).
tools/llama_tokenize.py loads each GGUF's vocabulary only and calls llama_tokenize with
add_special and parse_special on; our side is the tokenizer section the converter writes
for the same GGUF (webslm.convert.gguf_tokenizer), encoded with add_special. Skips without
the peer or a GGUF.

HOSTILE is the shared set: unicode (combining marks, RTL, CJK, ZWJ emoji sequences, astral
planes), whitespace runs (spaces, tabs, CR/LF, NBSP, ideographic space), digits in many
groupings and scripts, code, and chat markup (whole, partial and nested special tokens).

Every text must give the same ids, except the differences listed in KNOWN (text -> why),
which must still differ exactly as stated (and both spell the text): when llama.cpp changes,
the test says so. Seen on 2026-12-02: SmolLM2 76/76 alike; Gemma 3 75/76 (a run of 33 spaces:
RUN_OF_SPACES says why).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".assets" / "cache"
GGUFS = {"gemma3": CACHE / "gemma-3-270m-q4_k_m.gguf", "smollm2": CACHE / "SmolLM2-135M-Instruct.Q4_1.gguf"}
PEER = Path(os.environ.get("WEBSLM_LLAMA_PEER", ROOT / ".venv-peer" / "bin" / "python"))

HOSTILE = [
    # plain text, contractions and case (GPT-2-style splits)
    "Hello world", "I'm sure you're right; they'll see it's fine, we've done it, don't worry.",
    "I'M SHOUTING 'S 'T 'RE", "HELLO wOrLd CamelCaseIdentifier snake_case_name",
    # unicode
    "naïve café résumé", "e\u0301 vs \u00e9 (NFD vs NFC)", "Ünïcödé ŁÓDŹ straße STRASSE ẞ İstanbul ıi",
    "日本語のテキストです。", "中文，标点！", "한국어 텍스트", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
    "ภาษาไทย", "Ελληνικά Кириллица", "∑ 𝔘 ℝ ∞ ≠ ≤", "\U0001d54f\U0001d550\U0001d551 astral letters",
    "\u200b zero\u200bwidth \u200d joiner \ufeff bom", "\u00ad soft hyphen \u0007 bell \u001b[31m escape",
    # emoji
    "🙂🙂🙂", "👍🏽 thumbs", "👩‍👩‍👧 family", "🇫🇷🇯🇵 flags", "❤️ ✨🎉🔥", "🦄" * 7,
    # whitespace runs
    " ", "  ", "   leading", "trailing   ", "a  b   c    d     e", "\t", "\t\tindented\t\t",
    "\n", "\n\n", "\n\n\n\n\n", "line\r\nwindows\r\n", " \n \n ", "\u00a0nbsp\u00a0", "\u3000ideographic\u3000",
    " " * 33, "x" * 300,
    # digits
    "1234567890", "3.14159265358979", "1,000,000.00", "0x1F 0b1010 1e-9", "12345678901234567890123",
    "٣٤٥ ۱۲۳ १२३ ①②③ ⅷ", "2026-12-02T13:45:00Z", "+1 (555) 010-9999", "v1.2.3-rc.4",
    # code
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] << 2; }",
    "<html><body class=\"x\">&amp; &lt;</body></html>",
    '{"key": [1, 2, {"nested": null}], "s": "\\u00e9"}',
    "SELECT * FROM t WHERE a = 'b' AND c <> 3;",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "$ ls -la | grep '^d' && echo \"done\" >> /tmp/log",
    r"^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)$",
    "    \n\t\t}\n}\n\n\n",
    # chat markup, whole and broken
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\n<end_of_turn><eos>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|> and <|im_end|>", "<start_of_turn", "<|im_start|", "<<start_of_turn>>", "<|im_start|><|im_start|>",
    "<unused5> <mask> <pad>", "[INST] <<SYS>> [/INST]", "<0x41> is not a byte token in text",
    # punctuation runs
    "!!!!!?????", "...", "—–-", "=" * 64, "\"quoted\" 'single' `back`", "a/b\\c|d",
]

# text -> why ours differs from llama.cpp, per model (what was seen; see the docstring).
RUN_OF_SPACES = (
    "A run of 32 or more spaces (measured: every run of 32..80, alone or between letters; none "
    "shorter, no run of newlines, tabs, dashes or '=' up to 80). Gemma's vocabulary has a token for "
    "every run of 2..31 spaces. We merge as transformers' GGUF-built Gemma tokenizer does (BPE, "
    "merges ranked by the merged token's place in the vocabulary: 33 spaces = 16 + 17, the same ids "
    "as transformers); llama.cpp's SentencePiece path merges the highest-scoring pair first "
    "(33 = 31 + 2). Both spell the same text; our greedy ids are checked against transformers'.")
KNOWN: dict[str, dict[str, str]] = {"gemma3": {" " * 33: RUN_OF_SPACES}, "smollm2": {}}


def peer_tokenize(gguf_path: Path, texts: list[str]) -> list[list[int]]:
    if not PEER.exists():
        pytest.skip(f"no llama.cpp peer at {PEER} (tools/build_peer.sh builds it; or set WEBSLM_LLAMA_PEER)")
    request = json.dumps({"model": str(gguf_path), "texts": texts, "add_special": True, "parse_special": True})
    done = subprocess.run([str(PEER), str(ROOT / "tools" / "llama_tokenize.py")], input=request,
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "No module named 'llama_cpp'" in done.stderr:
        pytest.skip(f"{PEER} cannot import llama_cpp")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)["ids"]


def our_tokenizer(gguf_path: Path):
    """The tokenizer the converter would write into the .slm for this GGUF."""
    from webslm.convert.gguf import _Metadata, _open
    from webslm.convert.gguf_tokenizer import tokenizer_section
    from webslm.semantic.tokenizer import Tokenizer
    meta = _Metadata(_open(gguf_path), gguf_path.name)
    family = meta.get("general.architecture")
    vocab = len(meta.get("tokenizer.ggml.tokens"))
    return Tokenizer.from_manifest(tokenizer_section(meta, vocab, "gemma3" if family == "gemma3" else "llama"))


@pytest.mark.parametrize("name", sorted(GGUFS))
def test_hostile_strings_tokenize_like_llama_cpp(name):
    path = GGUFS[name]
    if not path.is_file():
        pytest.skip(f"{path.name} is missing (python tools/test_data.py / set-up fetches it)")
    theirs = peer_tokenize(path, HOSTILE)
    ours_tok = our_tokenizer(path)
    same, differ = 0, {}
    for text, want in zip(HOSTILE, theirs):
        got = ours_tok.encode(text)
        if got == want:
            same += 1
        else:
            differ[text] = (got, want)
    for text, (got, want) in differ.items():
        print(f"{name}: {text!r}\n  ours      {got}\n  llama.cpp {want}")
    print(f"{name}: {same}/{len(HOSTILE)} texts tokenize alike; {len(differ)} differ", file=sys.stderr)
    assert set(differ) == set(KNOWN[name]), {t: differ.get(t) for t in set(differ) ^ set(KNOWN[name])}
    for text, (got, want) in differ.items():      # two spellings of the same text, not a lost character
        assert ours_tok.decode(want, skip_special=True) == ours_tok.decode(got, skip_special=True) == text
