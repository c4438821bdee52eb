"""A fixed, mixed text corpus and an encode-throughput measurement for the tokenizer.

In the package (not only in bench/) because the Pyodide worker runs it too: the browser
tests compare its token ids with CPython's, and bench/tokenizer.py reports both runtimes.
"""
from __future__ import annotations

import hashlib
import json
import random
import time

CORPUS_SEED = 1130
CORPUS_CHARS = 1_000_000

_PROSE = ("The quick brown fox jumps over the lazy dog. It's 2024 and we've seen 3.14159 "
          "reasons why they'll say I'm right; don't you think? Prices rose 12% to $1,299.99.\n")
_CODE = ("def encode(self, text: str) -> list[int]:\n    ids = []\n    for piece in split(text):\n"
         "        ids.extend(self._cache.get(piece) or self._merge(piece))  # hot path\n"
         "    return ids\n\nfor (let i = 0; i < n; i++) { total += a[i] * 2; }\n")
_WORLD = ("Übermäßig schöne Grüße aus Köln. Ελληνικά κείμενα εδώ. Привет, как дела? "
          "مرحبا بالعالم. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก 你好，世界！今日は良い天気ですね。 "
          "안녕하세요 세계 😀👍🏽🇺🇸 👨\u200d👩\u200d👧\n")
_CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def corpus(chars: int = CORPUS_CHARS, seed: int = CORPUS_SEED) -> list[str]:
    """A fixed mix (roughly 45% English prose, 25% code, 25% other scripts and emoji, 5%
    chat markup) cut into texts of 200..4000 characters; about `chars` characters in all."""
    rng = random.Random(seed)
    sources = [(_PROSE, 45), (_CODE, 25), (_WORLD, 25), (_CHAT, 5)]
    words = {src: src.split(" ") for src, _ in sources}
    texts, total = [], 0
    while total < chars:
        size = rng.randint(200, 4000)
        parts, n = [], 0
        while n < size:
            src = rng.choices([s for s, _ in sources], [w for _, w in sources])[0]
            start = rng.randrange(len(words[src]))
            chunk = " ".join(words[src][start:start + rng.randint(3, 30)]) + rng.choice(" \n")
            parts.append(chunk)
            n += len(chunk)
        text = "".join(parts)[:size]
        texts.append(text)
        total += len(text)
    return texts


def measure(tokenizer, texts: list[str]) -> dict:
    """Encode `texts` cold (empty cache), then warm; chars/s and tokens/s for each."""
    chars = sum(map(len, texts))
    result = {"texts": len(texts), "chars": chars}
    tokenizer.clear_cache()
    for label in ("cold", "warm"):
        start = time.perf_counter()
        tokens = sum(len(tokenizer.encode(t, add_special=False)) for t in texts)
        seconds = time.perf_counter() - start
        result[label] = {"seconds": seconds, "tokens": tokens,
                         "chars_per_s": chars / seconds, "tokens_per_s": tokens / seconds}
    return result


def ids_digest(tokenizer, texts: list[str]) -> str:
    """sha256 of the canonical JSON of every text's token ids: equal digests, equal ids."""
    ids = [tokenizer.encode(t, add_special=False) for t in texts]
    return hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest()
