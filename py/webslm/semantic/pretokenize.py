"""Pre-tokenizers: cut text into the pieces that BPE then merges, exactly as Hugging Face
`tokenizers` does for each family, in pure Python (stdlib `re` + `unicodedata`).

The families' split patterns are written with Unicode classes that Python's `re` lacks
(`\\p{L}` letters, `\\p{N}` numbers; and `\\s` must be Unicode White_Space, which is not
quite what `re` means by it). So we do not run the patterns on the text itself. Instead:

1. Every character is replaced by one ASCII *class character* (`CLASS_OF` below):
   letters -> themselves if ASCII (the contractions need to see s, t, re, ve, m, ll, d),
   other letters -> "a"; numbers -> "0"; U+0020 -> " "; CR and LF -> "\\n"; any other
   White_Space -> "\\t"; the apostrophe -> "'"; everything else -> ".".
2. The family's pattern is rewritten over that alphabet, one-for-one
   (`\\p{L}` -> `[A-Za-z]`, `\\p{N}` -> `0`, `\\s` -> `[ \\t\\n]`, `[\\r\\n]` -> `\\n`, ...),
   and Python's `re` runs it on the class string.

The class string has exactly one character per text character, so match spans are text
spans. Python's `re` is a backtracking engine with the same leftmost-first alternation and
greedy/backtracking semantics as Oniguruma (what `tokenizers` uses), so each rewritten
pattern *is* the original pattern: nothing about lookahead or backtracking (`\\s+(?!\\S)`,
`\\s*[\\r\\n]+`) has to be re-derived by hand. It also runs at C speed, where a hand-written
per-character scanner in Python would not.

Unicode versions: categories come from the running Python's `unicodedata` (Unicode 14 on
CPython 3.11, 15 on Pyodide's 3.12). Characters assigned after that version are "Cn" here
and count as punctuation; `tokenizers` may classify them with newer tables.
"""
from __future__ import annotations

import re
import unicodedata

# Unicode White_Space, which is what Oniguruma's `\s` matches. Python's str.isspace() also
# accepts U+001C..U+001F (information separators), which `\s` does not, so spell it out.
WHITE_SPACE = frozenset("\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                        "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


class _ClassTable(dict):
    """char code -> class character, for str.translate; filled on first sight of a char."""

    def __missing__(self, code: int) -> str:
        char = chr(code)
        if char == " ":
            cls = " "
        elif char in "\r\n":
            cls = "\n"
        elif char in WHITE_SPACE:
            cls = "\t"
        elif char == "'":
            cls = "'"
        else:
            major = unicodedata.category(char)[0]
            if major == "L":
                cls = char if char.isascii() else "a"
            elif major == "N":
                cls = "0"
            else:
                cls = "."
        self[code] = cls
        return cls


CLASS_OF = _ClassTable()


def classify(text: str) -> str:
    """The class string of `text` (same length, one class character per character)."""
    return text.translate(CLASS_OF)


# --- The patterns, each next to its original. Over the class alphabet:
#     \p{L} = [A-Za-z]   \p{N} = 0   \s = [ \t\n]   \S = [^ \t\n]   [\r\n] = \n
#     [^\s\p{L}\p{N}] = [.']  (punctuation, symbols, marks, controls... and the apostrophe)
#     [^\r\n\p{L}\p{N}] = [^\nA-Za-z0]

# GPT-2, inside HF's ByteLevel(use_regex=True):
#   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
GPT2 = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?0+| ?[.']+|[ \t\n]+(?![^ \t\n])|[ \t\n]+")

# Llama 3 (HF Split, behavior Isolated, before ByteLevel(use_regex=False)):
#   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
#   | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
LLAMA3 = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\nA-Za-z0]?[A-Za-z]+|0{1,3}"
                    r"| ?[.']+\n*|[ \t\n]*\n+|[ \t\n]+(?![^ \t\n])|[ \t\n]+")

# Qwen2: Llama 3's pattern with single digits (\p{N} instead of \p{N}{1,3}).
QWEN2 = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\nA-Za-z0]?[A-Za-z]+|0"
                   r"| ?[.']+\n*|[ \t\n]*\n+|[ \t\n]+(?![^ \t\n])|[ \t\n]+")

DIGIT = re.compile(r"0")


def _regex_pieces(pattern: re.Pattern, text: str, classes: str, start: int, end: int,
                  out: list[str]) -> None:
    """Append the matches of `pattern` on text[start:end] (HF Split, behavior Isolated).
    endpos makes the class string end at `end`, so (?!\\S) sees the end of the stretch.
    Every pattern here matches every character class, so there are no gaps to keep."""
    for m in pattern.finditer(classes, start, end):
        out.append(text[m.start():m.end()])


def split_gpt2(text: str) -> list[str]:
    out: list[str] = []
    _regex_pieces(GPT2, text, classify(text), 0, len(text), out)
    return out


def split_smollm(text: str) -> list[str]:
    """SmolLM2's tokenizer.json: Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)].
    Every digit becomes a piece of its own; each stretch between digits then gets the GPT-2
    pattern *on its own* (so "a  1" is "a", "  ", "1": the spaces before a digit end their
    stretch and stay together, where plain GPT-2 would give "a", " ", " 1")."""
    classes = classify(text)
    out: list[str] = []
    start = 0
    for m in DIGIT.finditer(classes):
        if m.start() > start:
            _regex_pieces(GPT2, text, classes, start, m.start(), out)
        out.append(text[m.start()])
        start = m.end()
    if start < len(text):
        _regex_pieces(GPT2, text, classes, start, len(text), out)
    return out


def split_llama3(text: str) -> list[str]:
    out: list[str] = []
    _regex_pieces(LLAMA3, text, classify(text), 0, len(text), out)
    return out


def split_qwen2(text: str) -> list[str]:
    """Qwen2's tokenizer.json normalizes to NFC before its Split; so do we."""
    return split_qwen2_normalized(unicodedata.normalize("NFC", text))


def split_qwen2_normalized(text: str) -> list[str]:
    out: list[str] = []
    _regex_pieces(QWEN2, text, classify(text), 0, len(text), out)
    return out


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


SPLITTERS = {"gpt2": split_gpt2, "smollm": split_smollm, "llama3": split_llama3, "qwen2": split_qwen2}

# Each family as (normalizer, splitter of normalized text): the tokenizer's bounded encoding
# normalizes the whole text once and then splits it a window at a time.
NORMALIZED_SPLITTERS = {"gpt2": (None, split_gpt2), "smollm": (None, split_smollm),
                        "llama3": (None, split_llama3), "qwen2": (nfc, split_qwen2_normalized)}
