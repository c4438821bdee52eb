"""Lexer (Jinja 3.1's rules, trim_blocks=True, lstrip_blocks=True): source text -> tokens,
including newline normalisation, `-`/`+` whitespace control and string-literal decoding."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import TemplateError, TemplateSyntaxError


_NEWLINE = re.compile(r"(\r\n|\r|\n)")
_WHITESPACE = re.compile(r"\s+")
_STRING = re.compile(r"('([^'\\]*(?:\\.[^'\\]*)*)'" r'|"([^"\\]*(?:\\.[^"\\]*)*)")', re.S)
_INTEGER = re.compile(r"(0b(_?[0-1])+|0o(_?[0-7])+|0x(_?[\da-f])+|[1-9](_?\d)*|0(_?0)*)", re.I)
_FLOAT = re.compile(r"(?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+)", re.I)
_NAME = re.compile(r"\w+")
_OPERATORS = {
    "+": "add", "-": "sub", "/": "div", "//": "floordiv", "*": "mul", "%": "mod", "**": "pow",
    "~": "tilde", "[": "lbracket", "]": "rbracket", "(": "lparen", ")": "rparen", "{": "lbrace",
    "}": "rbrace", "==": "eq", "!=": "ne", ">": "gt", ">=": "gteq", "<": "lt", "<=": "lteq",
    "=": "assign", ".": "dot", ":": "colon", "|": "pipe", ",": "comma", ";": "semicolon",
}
_OPERATOR = re.compile("|".join(re.escape(op) for op in sorted(_OPERATORS, key=lambda s: -len(s))))
# The earliest tag start; `{% raw %}` is tried before a plain block start at the same position.
_ROOT = re.compile(
    r"(.*?)(?:(?P<raw_begin>\{%(\-|\+|)\s*raw\s*(?:\-%\}\s*|%\}))|(?P<variable_begin>\{\{(\-|\+|))"
    r"|(?P<comment_begin>\{#(\-|\+|))|(?P<block_begin>\{%(\-|\+|)))", re.S)
_COMMENT_END = re.compile(r"(.*?)((?:\+#\}|\-#\}\s*|#\}\n?))", re.S)
_BLOCK_END = re.compile(r"\+%\}|\-%\}\s*|%\}\n?")       # `\n?`: trim_blocks
_VARIABLE_END = re.compile(r"\-\}\}\s*|\}\}")
_RAW_END = re.compile(r"(.*?)((?:\{%(\-|\+|))\s*endraw\s*(?:\+%\}|\-%\}\s*|%\}\n?))", re.S)
_CLOSERS = {"lbrace": "rbrace", "lparen": "rparen", "lbracket": "rbracket"}


@dataclass(frozen=True)
class Token:
    type: str
    value: Any
    pos: int


class Source:
    """The normalised source text; turns offsets into 1-based line/column for errors."""

    def __init__(self, text: str):
        self.text = text

    def where(self, pos: int) -> tuple[int, int]:
        line = self.text.count("\n", 0, pos) + 1
        return line, pos - (self.text.rfind("\n", 0, pos) + 1) + 1

    def error(self, cls, message: str, pos: int, construct: str | None = None) -> TemplateError:
        line, column = self.where(pos)
        return cls(message, line=line, column=column, construct=construct)


def normalise(source: str) -> str:
    # Jinja: every newline style becomes "\n", and one trailing newline is dropped
    # (keep_trailing_newline=False).
    lines = _NEWLINE.split(source)[::2]
    if lines[-1] == "":
        del lines[-1]
    return "\n".join(lines)


def _lstrip(text: str, sign: str, is_variable: bool, line_starting: bool) -> str:
    """Whitespace control before a tag: `-` strips all whitespace; otherwise lstrip_blocks strips
    the spaces that precede a block/comment tag alone at the start of its line."""
    if sign == "-":
        return text.rstrip()
    if sign != "+" and not is_variable:
        l_pos = text.rfind("\n") + 1
        if (l_pos > 0 or line_starting) and _WHITESPACE.fullmatch(text, l_pos):
            return text[:l_pos]
    return text


def tokenize(src: Source) -> list[Token]:
    source = src.text
    tokens: list[Token] = []
    pos, end = 0, len(source)
    line_starting = True  # did the previous lexer match end with a newline?
    while pos < end:
        m = _ROOT.match(source, pos)
        if m is None:
            tokens.append(Token("data", source[pos:], pos))
            break
        kind = next(k for k in ("raw_begin", "variable_begin", "comment_begin", "block_begin")
                    if m.group(k) is not None)
        sign = next(g for g in m.groups()[2::2] if g is not None)
        text = _lstrip(m.group(1), sign, kind == "variable_begin", line_starting)
        if text:
            tokens.append(Token("data", text, pos))
        tag_pos = m.start(kind)
        line_starting = m.group()[-1:] == "\n"
        pos = m.end()
        if kind == "comment_begin":
            c = _COMMENT_END.match(source, pos)
            if c is None:
                raise src.error(TemplateSyntaxError, "missing end of comment tag", tag_pos, "comment")
            pos, line_starting = c.end(), c.group()[-1:] == "\n"
        elif kind == "raw_begin":
            r = _RAW_END.match(source, pos)
            if r is None:
                raise src.error(TemplateSyntaxError, "missing end of raw directive", tag_pos, "raw")
            text = _lstrip(r.group(1), r.group(3), False, line_starting)
            if text:
                tokens.append(Token("data", text, pos))
            pos, line_starting = r.end(), r.group()[-1:] == "\n"
        else:
            pos, line_starting = _tokenize_tag(src, pos, tag_pos, kind, tokens)
    tokens.append(Token("eof", None, end))
    return tokens


def _tokenize_tag(src: Source, pos: int, tag_pos: int, kind: str, tokens: list) -> tuple[int, bool]:
    """Tokens inside `{{ }}` / `{% %}` up to the end tag (only matched with balanced brackets)."""
    source = src.text
    end_re = _VARIABLE_END if kind == "variable_begin" else _BLOCK_END
    tokens.append(Token(kind, None, tag_pos))
    balance: list[str] = []
    while True:
        if pos >= len(source):
            raise src.error(TemplateSyntaxError, "unexpected end of template inside a tag", tag_pos,
                            "variable" if kind == "variable_begin" else "block")
        if not balance:
            m = end_re.match(source, pos)
            if m is not None:
                tokens.append(Token(kind.replace("_begin", "_end"), None, pos))
                return m.end(), m.group()[-1:] == "\n"
        m = _WHITESPACE.match(source, pos)
        if m is not None:
            pos = m.end()
            continue
        if (m := _FLOAT.match(source, pos)) is not None:
            tokens.append(Token("float", float(m.group().replace("_", "")), pos))
        elif (m := _INTEGER.match(source, pos)) is not None:
            tokens.append(Token("integer", int(m.group().replace("_", ""), 0), pos))
        elif (m := _NAME.match(source, pos)) is not None:
            if not m.group().isidentifier():
                raise src.error(TemplateSyntaxError, "invalid character in identifier", pos, "name")
            tokens.append(Token("name", m.group(), pos))
        elif (m := _STRING.match(source, pos)) is not None:
            tokens.append(Token("string", _decode_string(src, m.group()[1:-1], pos), pos))
        elif (m := _OPERATOR.match(source, pos)) is not None:
            op = _OPERATORS[m.group()]
            if op in _CLOSERS:
                balance.append(_CLOSERS[op])
            elif op in ("rbrace", "rparen", "rbracket"):
                if not balance or balance.pop() != op:
                    raise src.error(TemplateSyntaxError, f"unexpected {m.group()!r}", pos, m.group())
            tokens.append(Token(op, m.group(), pos))
        else:
            raise src.error(TemplateSyntaxError, f"unexpected char {source[pos]!r}", pos, "lexer")
        pos = m.end()


def _decode_string(src: Source, body: str, pos: int) -> str:
    # Exactly Jinja's decoding: Python escape sequences (\n, \x41, \u00e9, \N{...}); unknown
    # escapes stay as written; non-ASCII text survives the round trip through backslashreplace.
    try:
        return body.encode("ascii", "backslashreplace").decode("unicode-escape")
    except Exception as exc:  # noqa: BLE001 -- whatever the codec raises, the literal is bad
        raise src.error(TemplateSyntaxError, f"bad string literal: {exc}", pos, "string") from None
