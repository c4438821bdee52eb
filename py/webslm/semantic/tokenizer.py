"""The tokenizer: text <-> token ids, built from the manifest's "tokenizer" section, with
exact parity to Hugging Face `tokenizers` for the families docs/slm-format.md names.

Pure Python (stdlib only) so the same code runs natively and in the Pyodide worker.

Encoding, top to bottom (`Tokenizer.encode`):
1. Special tokens (and "added tokens", their non-control kin: Gemma's "\n\n") are cut out
   of the text first: leftmost match, longest first at a position, matched verbatim (HF
   added tokens with lstrip/rstrip/normalized all false, which is how SmolLM2's and the
   GGUF-built ones are defined).
2. Each stretch of text between them becomes words:
   - byte-level BPE: the family pre-tokenizer (pretokenize.py) cuts it into pieces; each
     piece's UTF-8 bytes are spelled with the GPT-2 byte-to-unicode alphabet;
   - SentencePiece-style BPE: the whole stretch is one word, spaces spelled "▁" and one
     "▁" prepended (Llama 2's tokenizer.json: Prepend("▁") + Replace(" ", "▁"), per stretch);
     pre-tokenizer "gemma" prepends nothing (Gemma's tokenizer.json: Replace(" ", "▁") alone;
     its Split(" ") pre-tokenizer runs after that replacement and so never splits).
3. Each word is merged by BPE (`_merge`: HF's algorithm: lowest rank first, leftmost on
   ties) and its tokens looked up. Words are cached.
4. BOS/EOS are added per the manifest when add_special is true.

`encode(text, max_tokens=n)` gives the same ids, or raises TooManyTokens as soon as it is
sure there are more than n, having done work and held memory for about n tokens' worth of
text, not the whole text: a prompt is checked against the context this way before it is
tokenized in full (request.prompt_ids). Pre-tokenization then runs WINDOW characters at a
time (`_windowed`), and a word is not merged when its symbols alone prove it needs more
tokens than are left (no token covers more than `max_token_chars` symbols).

Decoding (`Tokenizer.decode`) is HF's decoder for the family; `StreamDecoder` emits the
same text incrementally. Skipping special tokens skips only special ones: added tokens are text.
"""
from __future__ import annotations

import heapq
import re
from typing import Any, Iterable, Mapping

from .pretokenize import NORMALIZED_SPLITTERS, SPLITTERS

SPACE_MARK = "\u2581"                 # "▁", SentencePiece's spelling of a space
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
CACHE_WORD_CHARS = 256                # HF caches words shorter than this too
CACHE_ENTRIES = 1 << 16               # bounded: the cache is emptied when it fills
WINDOW = 1 << 16                      # characters pre-tokenized at a time under max_tokens


class TooManyTokens(ValueError):
    """encode(max_tokens=n) found that the text has more than n tokens (and stopped)."""

    def __init__(self, limit: int):
        super().__init__(f"the text has more than {limit} tokens")
        self.limit = limit


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes stand for
    themselves, the other 68 bytes get U+0100 onward, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
_SPELL_BYTES = {b: c for b, c in BYTE_TO_CHAR.items()}   # str.translate table over latin-1


class Tokenizer:
    def __init__(self, tokens: Iterable[str], merges: Iterable[str], *, byte_level: bool,
                 pre_tokenizer: str, special_tokens: Iterable[int] = (),
                 bos_id: int | None = None, eos_ids: Iterable[int] = (),
                 unk_id: int | None = None, add_bos: bool = False, add_eos: bool = False,
                 add_dummy_prefix: bool = True, added_tokens: Iterable[int] = ()):
        self.tokens: list[str] = list(tokens)
        self.vocab: dict[str, int] = {t: i for i, t in enumerate(self.tokens)}
        # "left right" -> rank. A merge's pieces never contain a space (byte-level spells
        # it "Ġ", SentencePiece "▁"), so splitting at the one space is unambiguous.
        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            left, right = merge.split(" ")
            self.ranks.setdefault((left, right), rank)
        self.byte_level = byte_level
        if byte_level:
            if pre_tokenizer not in SPLITTERS:
                raise ValueError(f"unknown byte-level pre-tokenizer {pre_tokenizer!r}")
            self._split = SPLITTERS[pre_tokenizer]
            self._normalize, self._split_normalized = NORMALIZED_SPLITTERS[pre_tokenizer]
        elif pre_tokenizer not in ("sentencepiece", "gemma"):
            raise ValueError(f"unknown pre-tokenizer {pre_tokenizer!r} for SentencePiece BPE")
        # Llama 3's tokenizer.json sets BPE ignore_merges: a piece that is itself a token is
        # that token, whatever the merges would make of it (llama.cpp does the same).
        self.ignore_merges = byte_level and pre_tokenizer == "llama3"
        self.add_dummy_prefix = add_dummy_prefix
        self.special_ids = frozenset(special_tokens)
        self.bos_id, self.eos_ids, self.unk_id = bos_id, tuple(eos_ids), unk_id
        self.add_bos, self.add_eos = add_bos, add_eos
        self.added_ids = frozenset(added_tokens)
        specials = sorted({self.tokens[i] for i in self.special_ids | self.added_ids}, key=len, reverse=True)
        # Alternatives longest first: at the leftmost position the longest special wins.
        self._specials = re.compile("|".join(map(re.escape, specials))) if specials else None
        self._cache: dict[str, tuple[int, ...]] = {}
        # No token is the merge of more symbols than it has characters (each symbol is a
        # token string of at least one character): the bound encode(max_tokens=) uses.
        self.max_token_chars = max(map(len, self.tokens), default=1)
        # Byte-level: characters of the byte alphabet that are not tokens are dropped
        # (_initial_symbols); SentencePiece: whether every byte has its <0xNN> token, so
        # that every character is at least one symbol.
        self._dropped = [c for c in BYTE_TO_CHAR.values() if c not in self.vocab] if byte_level else []
        # Decoding tables: per id, the bytes (byte-level) or text (SentencePiece) it stands for.
        if byte_level:
            self._token_bytes = [_byte_level_bytes(t) for t in self.tokens]
        else:
            self._byte_of = [_byte_value(t) for t in self.tokens]   # None unless <0xNN>
            self._byte_token = [self.vocab.get(f"<0x{b:02X}>") for b in range(256)]

    @classmethod
    def from_manifest(cls, section: Mapping[str, Any]) -> "Tokenizer":
        if section.get("model") != "bpe":
            raise ValueError(f"tokenizer model {section.get('model')!r} is not supported")
        return cls(section["tokens"], section["merges"],
                   byte_level=bool(section["byte_level"]),
                   pre_tokenizer=section["pre_tokenizer"],
                   special_tokens=[s["id"] for s in section["special_tokens"]],
                   bos_id=section.get("bos_id"), eos_ids=section.get("eos_ids") or (),
                   unk_id=section.get("unk_id"),
                   add_bos=bool(section.get("add_bos")), add_eos=bool(section.get("add_eos")),
                   add_dummy_prefix=section["pre_tokenizer"] != "gemma",
                   added_tokens=[a["id"] for a in section.get("added_tokens", ())])

    # ------------------------------------------------------------------ lookups

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.vocab.get(token)

    def id_to_token(self, token_id: int) -> str:
        return self.tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    def clear_cache(self) -> None:
        self._cache.clear()

    # ------------------------------------------------------------------ encode

    def encode(self, text: str, add_special: bool = True, max_tokens: int | None = None) -> list[int]:
        """The token ids of `text`; with max_tokens, TooManyTokens as soon as there are more."""
        ids: list[int] = []
        if add_special and self.add_bos and self.bos_id is not None:
            ids.append(self.bos_id)
        start = 0
        try:
            if self._specials is not None:
                for m in self._specials.finditer(text):
                    self._encode_ordinary(text[start:m.start()], ids, max_tokens)
                    ids.append(self.vocab[m.group()])
                    start = m.end()
            self._encode_ordinary(text[start:], ids, max_tokens)
        except TooManyTokens:
            raise TooManyTokens(max_tokens) from None      # the whole text's limit, not a word's share
        if add_special and self.add_eos:
            ids.extend(self.eos_ids[:1])
        if max_tokens is not None and len(ids) > max_tokens:
            raise TooManyTokens(max_tokens)
        return ids

    def _encode_ordinary(self, text: str, ids: list[int], max_tokens: int | None = None) -> None:
        """Text with no special tokens in it -> ids, appended to `ids`."""
        if not text:
            return
        if self.byte_level:
            pieces = self._split(text) if max_tokens is None else self._windowed(text)
            for piece in pieces:
                word = piece.encode("utf-8").decode("latin-1").translate(_SPELL_BYTES)
                ids.extend(self._word_ids(word, None if max_tokens is None else max_tokens - len(ids)))
                if max_tokens is not None and len(ids) > max_tokens:
                    raise TooManyTokens(max_tokens)
        else:
            budget = None if max_tokens is None else max_tokens - len(ids)
            # the whole stretch is one word: refuse it before copying it, when its length
            # already proves too many symbols (every character is at least one)
            if budget is not None and None not in self._byte_token and \
                    len(text) + self.add_dummy_prefix > budget * self.max_token_chars:
                raise TooManyTokens(max_tokens)
            word = text.replace(" ", SPACE_MARK)
            word = SPACE_MARK + word if self.add_dummy_prefix else word
            ids.extend(self._word_ids(word, budget))

    def _windowed(self, text: str):
        """The pre-tokenizer's pieces of `text`, cut WINDOW characters at a time. The last
        two pieces of a window may depend on what follows it (a run of letters or spaces that
        goes on, the lookahead of \\s+(?!\\S)), so they are cut again with the next window;
        the pieces before them are the whole text's (tests/test_tokenizer_bounded.py)."""
        if self._normalize is not None:
            text = self._normalize(text)
        start, window = 0, WINDOW
        while len(text) - start > window:
            pieces = self._split_normalized(text[start:start + window])
            if len(pieces) < 3:            # one piece may run past the window: look further
                window *= 2
                continue
            for piece in pieces[:-2]:
                yield piece
                start += len(piece)
            window = WINDOW
        yield from self._split_normalized(text[start:])

    def _word_ids(self, word: str, budget: int | None = None) -> tuple[int, ...]:
        """The ids of one word; with a budget, TooManyTokens instead of merging a word whose
        symbols alone need more than `budget` tokens."""
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        vocab = self.vocab
        if budget is not None and len(word) > budget * self.max_token_chars and not (
                self.ignore_merges and word in vocab) and self._symbol_count(word) > budget * self.max_token_chars:
            raise TooManyTokens(budget)
        if self.ignore_merges and word in vocab:
            ids = (vocab[word],)
        else:
            ids = tuple(vocab[t] for t in _merge(self._initial_symbols(word), self.ranks))
        if len(word) < CACHE_WORD_CHARS:
            if len(self._cache) >= CACHE_ENTRIES:
                self._cache.clear()
            self._cache[word] = ids
        return ids

    def _symbol_count(self, word: str) -> int:
        """len(_initial_symbols(word)), or a lower bound of it, without making the list."""
        if self.byte_level:
            return len(word) - sum(word.count(c) for c in self._dropped)
        if None not in self._byte_token:   # every character is a token or its bytes' tokens
            return len(word)
        return len(self._initial_symbols(word))

    def _initial_symbols(self, word: str) -> list[str]:
        """One symbol per character, as HF BPE starts a word. A character that is not a
        token: SentencePiece spells its UTF-8 bytes as <0xNN> tokens (byte_fallback);
        failing that it becomes the unknown token, consecutive unknowns fused into one
        (fuse_unk). Byte-level BPE has no unknown token in HF (SmolLM2's tokenizer.json:
        unk_token null, though its GGUF names one): a byte missing from the vocabulary
        (SmolLM2 lacks some control bytes, e.g. 0x06) is dropped, as HF drops it."""
        vocab, symbols = self.vocab, []
        unk = None if self.byte_level or self.unk_id is None else self.tokens[self.unk_id]
        for char in word:
            if char in vocab:
                symbols.append(char)
                continue
            if not self.byte_level:
                byte_ids = [self._byte_token[b] for b in char.encode("utf-8")]
                if None not in byte_ids:
                    symbols.extend(self.tokens[i] for i in byte_ids)
                    continue
            if unk is not None and not (symbols and symbols[-1] == unk):
                symbols.append(unk)
        return symbols

    # ------------------------------------------------------------------ decode

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        stream = StreamDecoder(self, skip_special=skip_special)
        return "".join(stream.push(i) for i in ids) + stream.flush()

    def token_bytes(self, token_id: int) -> bytes:
        """Byte-level only: the bytes token `token_id` stands for."""
        return self._token_bytes[token_id]

    def piece_bytes(self, token_id: int) -> bytes | None:
        """The bytes one token stands for on its own (what logprobs report): byte-level, its
        bytes; SentencePiece, a <0xNN> token's byte, else its text with the space mark as a
        space. None for an id beyond the token list (a padding row)."""
        if not 0 <= token_id < len(self.tokens):
            return None
        if self.byte_level:
            return self._token_bytes[token_id]
        byte = self._byte_of[token_id]
        if byte is not None:
            return bytes([byte])
        return self.tokens[token_id].replace(SPACE_MARK, " ").encode("utf-8")


def _byte_level_bytes(token: str) -> bytes:
    """HF ByteLevel decoder, per token: map each character back to its byte; a token with
    a character outside the byte alphabet (an added token) stands for its own UTF-8."""
    try:
        return bytes(CHAR_TO_BYTE[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


def _byte_value(token: str) -> int | None:
    m = BYTE_TOKEN.fullmatch(token)
    return int(m.group(1), 16) if m else None


def _merge(symbols: list[str], ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """BPE as HF `tokenizers` runs it: repeatedly merge the adjacent pair of lowest rank,
    the leftmost one on ties, until no adjacent pair has a rank. A heap of (rank, position)
    with lazy invalidation keeps long words (a 10k-character CJK run is one word) fast."""
    n = len(symbols)
    if n < 2:
        return symbols
    symbols = list(symbols)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        rank = ranks.get((symbols[i], symbols[i + 1]))
        if rank is not None:
            heap.append((rank, i))
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        j = nxt[i]
        # Stale entry: i was merged into its left neighbour, or its pair changed since.
        if symbols[i] is None or j == -1 or ranks.get((symbols[i], symbols[j])) != rank:
            continue
        symbols[i] += symbols[j]
        symbols[j] = None
        k = nxt[j]
        nxt[i] = k
        if k != -1:
            prv[k] = i
            rank = ranks.get((symbols[i], symbols[k]))
            if rank is not None:
                heapq.heappush(heap, (rank, i))
        p = prv[i]
        if p != -1:
            rank = ranks.get((symbols[p], symbols[i]))
            if rank is not None:
                heapq.heappush(heap, (rank, p))
    return [s for s in symbols if s is not None]


class StreamDecoder:
    """Token ids in, text out, as they come: the concatenation of everything `push` and
    `flush` return equals `tokenizer.decode(all ids)` exactly.

    Byte-level: bytes are buffered and decoded up to, not including, a trailing UTF-8
    sequence that is still incomplete; cutting just before a lead byte is safe because
    a decoder never reads a lead byte as part of the sequence before it.
    SentencePiece: a run of <0xNN> byte tokens is decoded as a whole (valid UTF-8 -> its
    text, else one U+FFFD per byte, as HF's ByteFallback decoder does), so a run is held
    until a non-byte token ends it: a later byte in the same run could still invalidate it.
    The one leading space HF strips (the dummy prefix) is stripped from the first text out.

    An id at or beyond the end of the token list (a padding row: a model's vocabulary may be
    rounded up past its tokenizer's tokens, as the fixture's is) has no text: it decodes to
    "" and leaves any pending bytes pending, as HF's decode drops ids it has no token for.
    The sampler can choose such an id; the answer then goes on with no text for it.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._pending = bytearray()
        self._started = False          # SentencePiece: has any character been emitted yet

    def push(self, token_id: int) -> str:
        tok = self.tokenizer
        if token_id < 0:
            raise IndexError(f"token id {token_id} is negative")
        if token_id >= len(tok.tokens):
            return ""                      # a padding id: no token, no text (see above)
        token = tok.tokens[token_id]
        if self.skip_special and token_id in tok.special_ids:
            return ""                      # skipped before decoding, as HF does
        if tok.byte_level:
            self._pending += tok._token_bytes[token_id]
            cut = _complete_prefix(self._pending)
            text = self._pending[:cut].decode("utf-8", "replace")
            del self._pending[:cut]
            return text
        byte = tok._byte_of[token_id]
        if byte is not None:
            self._pending.append(byte)
            return ""
        return self._emit(self._byte_run() + token.replace(SPACE_MARK, " "))

    def flush(self) -> str:
        if self.tokenizer.byte_level:
            text = self._pending.decode("utf-8", "replace")
            self._pending.clear()
            return text
        return self._emit(self._byte_run())

    def _byte_run(self) -> str:
        run = bytes(self._pending)
        self._pending.clear()
        try:
            return run.decode("utf-8")
        except UnicodeDecodeError:
            return "\ufffd" * len(run)

    def _emit(self, text: str) -> str:
        # HF's Strip(" ", start=1) decoder: one leading space off the whole decoded text.
        if text and not self._started:
            self._started = True
            if self.tokenizer.add_dummy_prefix and text[0] == " ":
                text = text[1:]
        return text


def _complete_prefix(buf: bytearray) -> int:
    """Length of the longest prefix of `buf` that does not end inside an incomplete UTF-8
    sequence: the cut goes before a lead byte in the last 3 bytes that still lacks bytes."""
    n = len(buf)
    for back in range(1, min(n, 3) + 1):
        b = buf[n - back]
        if b < 0x80:
            return n                       # ASCII: nothing open after it
        if b >= 0xC0:                      # a lead byte: is its sequence complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4 if b < 0xF8 else 1
            return n - back if back < need else n
    return n                               # only continuation bytes (or 4 of them): closed
