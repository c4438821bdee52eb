"""Mutated .slm files for the fuzz tests and benches: one seeded mutation of a valid file.

    rng = random.Random(seed)
    kind, data = mutate(rng, valid_bytes)

Most mutations go through slm_surgery (split, change, join with fresh hashes), so a defect
deep in the file is met by the validator as that defect and not as a hash mismatch at the
top. The values tried are the ones that break parsers: numbers at and next to every bound,
ints as floats, huge ints (also past Python's 4300-digit limit), NaN and infinities as
JSON text, lone surrogates, invalid UTF-8, duplicate keys, deep nesting, header sizes that
claim gigabytes. A share of the mutations keeps the file valid (a note, a template, a
value inside its range), so that false rejection shows up too.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
import struct

import slm_surgery as surgery
from webslm.artifact import format as fmt

SURROGATE = re.compile("[\ud800-\udfff]")
KINDS = (("manifest", 25), ("table", 20), ("header", 10), ("bytes", 12), ("payload", 10),
         ("json-text", 10), ("length", 5), ("keys", 8))

# JSON text that json.dumps cannot write: a placeholder string is replaced in the bytes.
RAW = {"@@BIG@@": "1" + "0" * 5000, "@@NAN@@": "NaN", "@@INF@@": "-Infinity", "@@HUGE@@": "1e400",
       "@@DEEP@@": "[" * 50_000 + "]" * 50_000, "@@LONGINT@@": "9" * 60}

LEAVES = [None, True, False, 0, 1, -1, 2, 3, 7, 8, 255, 256, 4096, 2**24, 2**24 + 1, 2**31, 2**32, 2**53 + 1,
          2**63, 2**64, 2**70, -2**63, 0.0, -0.0, 0.5, 1.0, 1.5, 0.999999, 0.9999995, 1e-300, 5e-324, 1e12,
          1e12 + 1, 1e300, 1.7976931348623157e308, 64.0, 256.0, "", "x", "f16", "f32", "q4", "q8", "min",
          "offset", "none", "llama", "bpe", "jinja", "\ud800", "a\udc80b", "\x00", "é", "\U0001f600",
          "a" * 5000, [], {}, [0], [1, 2], [0, 256], {"x": 1}, [[[]]], *RAW]


def mutate(rng: random.Random, base: bytes) -> tuple[str, bytes]:
    names, weights = zip(*KINDS)
    kind = rng.choices(names, weights)[0]
    return kind, MUTATORS[kind](rng, base)


# -- JSON values -----------------------------------------------------------------------------------

def paths(value, prefix=()):
    """Every path into a JSON value (dict keys; the first, second and last list elements)."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index in sorted({0, 1, len(value) - 1} & set(range(len(value)))):
            yield from paths(value[index], prefix + (index,))


def get(root, path):
    for key in path:
        root = root[key]
    return root


def put(root, path, value):
    if not path:
        return value
    get(root, path[:-1])[path[-1]] = value
    return root


def near(rng: random.Random, value):
    """A value next to `value`: across its bound, or of a kindred type."""
    if isinstance(value, bool):
        return rng.choice([not value, int(value), None, str(value).lower()])
    if isinstance(value, int):
        return rng.choice([value + 1, value - 1, value * 2, value // 2, -value, 0, float(value), str(value),
                           [value], value + 256, value - 256, value + 2**32, True])
    if isinstance(value, float):
        return rng.choice([value * 2, -value, 0.0, int(value), value + 1e-9, 1.0, value * 1e300, value / 2, 1])
    if isinstance(value, str):
        return rng.choice(["", value + "x", value[:-1], value.upper(), value + "\ud800", None, value * 2,
                           value + " " + value, "Ġ" + value])
    if isinstance(value, list):
        choices = [[], value + value[-1:], value[::-1], value + [0]]
        if value:
            choices += [value[:-1], value[1:], [value[0]] + value]
        return rng.choice(choices)
    if isinstance(value, dict):
        smaller = dict(value)
        if smaller:
            smaller.pop(rng.choice(sorted(smaller)))
        return rng.choice([smaller, {**value, "extra": 1}, {}])
    return rng.choice(LEAVES)


def new_value(rng: random.Random, old):
    return near(rng, old) if rng.random() < 0.6 else rng.choice(LEAVES)


def dumps(value, rng: random.Random) -> bytes:
    """Canonical-looking JSON, with the RAW placeholders written as raw text. Lone surrogates
    are written as \\u escapes (ensure_ascii), which is valid UTF-8 text; else either form."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=rng.random() < 0.3)
    if SURROGATE.search(text):
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    for placeholder, raw in RAW.items():
        text = text.replace(json.dumps(placeholder), raw)
    return text.encode("utf-8")


def _section_mutation(rng, base, section: str) -> bytes:
    pieces = surgery.split(base)
    root = getattr(pieces, section)
    path = rng.choice(list(paths(root)))
    root = put(root, path, new_value(rng, get(root, path)))
    return _join(rng, pieces, section, root)


def _join(rng, pieces, section: str, root) -> bytes:
    """The file with `section` replaced by `root`; most often with the tensors' sha256
    made to match again (before the table is written, so the table carries them)."""
    setattr(pieces, section, root)
    if rng.random() < 0.85:
        surgery.rehash_tensors(pieces)
    raw = dumps(getattr(pieces, section), rng)
    kwargs = {"manifest_bytes": raw} if section == "manifest" else {"table_bytes": raw}
    return surgery.join(pieces, rehash=False, **kwargs)


def manifest_value(rng, base):
    return _section_mutation(rng, base, "manifest")


def table_value(rng, base):
    return _section_mutation(rng, base, "table")


def keys(rng, base):
    """Drop a key, add an unknown one, or duplicate one in the JSON text."""
    pieces = surgery.split(base)
    section = rng.choice(["manifest", "table"])
    root = getattr(pieces, section)
    objects = [p for p in paths(root) if isinstance(get(root, p), dict) and get(root, p)]
    target = get(root, rng.choice(objects))
    action = rng.choice(["drop", "add", "duplicate"])
    if action == "drop":
        target.pop(rng.choice(sorted(target)))
    elif action == "add":
        target[rng.choice(["extra", "Format", "version ", "notes"])] = rng.choice(LEAVES[:20])
    if action != "duplicate":
        return _join(rng, pieces, section, root)
    raw = dumps(root, rng)          # the root object's first pair, written twice
    first = raw[1:raw.index(b",")] if b"," in raw else raw[1:-1]
    raw = b"{" + first + b"," + raw[1:]
    kwargs = {"manifest_bytes": raw} if section == "manifest" else {"table_bytes": raw}
    return surgery.join(pieces, rehash=False, **kwargs)


def json_text(rng, base):
    """Damage the manifest's text itself: invalid UTF-8, a stray byte, a cut."""
    pieces = surgery.split(base)
    section = rng.choice(["manifest", "table"])
    raw = bytearray(surgery.canonical_json(getattr(pieces, section)))
    at = rng.randrange(len(raw))
    action = rng.choice(["utf8", "byte", "cut", "escape"])
    if action == "utf8":
        raw[at:at] = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"])
    elif action == "byte":
        raw[at] = rng.randrange(256)
    elif action == "cut":
        del raw[at:]
        raw = raw or bytearray(b"{")
    else:                           # an escape inside the first string after `at`
        quote = raw.find(b'"', at)
        if quote >= 0:
            raw[quote + 1:quote + 1] = rng.choice([b"\\ud800", b"\\udfff", b"\\u0000", b"\\ud83d\\ude00", b"\\x"])
    kwargs = {"manifest_bytes": bytes(raw)} if section == "manifest" else {"table_bytes": bytes(raw)}
    return surgery.join(pieces, **kwargs)


HEADER_FIELDS = ("version", "header_length", "manifest_offset", "manifest_length", "table_offset", "table_length",
                 "payload_offset", "payload_length", "file_length", "payload_alignment")


def header(rng, base):
    pieces = surgery.split(base)
    if rng.random() < 0.25:         # a consistent header whose file claims a huge payload
        claim = rng.choice([1 << 30, 2 << 30, (16 << 30) - (1 << 20), 16 << 30, 1 << 40])
        payload_offset = fmt.HEADER.unpack_from(base)[7]
        data = surgery.join(pieces, header={"payload_length": claim, "file_length": payload_offset + claim + 32})
        return data[:rng.choice([fmt.HEADER_LENGTH, 4096, len(data)])]
    field = rng.choice(HEADER_FIELDS)
    width = 4 if field in ("version", "header_length", "payload_alignment") else 8
    current = dict(zip(("magic", *HEADER_FIELDS[:-1], "payload_alignment"), fmt.HEADER.unpack_from(base)))[field]
    value = rng.choice([rng.randrange(2 ** (8 * width)), rng.randrange(4096), current + 1, current - 1,
                        current + 256, 2 << 30, 16 << 30, (16 << 30) + 1, 2 ** (8 * width) - 1, 0])
    value %= 2 ** (8 * width)
    data = surgery.join(pieces, header={field: value})
    if rng.random() < 0.3:          # the header alone: a tiny file that claims a huge one
        data = data[:fmt.HEADER_LENGTH]
    return data


def byte_flips(rng, base):
    blob = bytearray(base)
    for _ in range(rng.randint(1, 4)):
        limit = rng.choice([128, 4096, len(blob)])
        blob[rng.randrange(min(limit, len(blob)))] = rng.randrange(256)
    if rng.random() < 0.5:
        blob = bytearray(surgery.retrailer(blob))
    return bytes(blob)


def payload(rng, base):
    """A value defect in one tensor, its sha256 (and the file's) made to match."""
    pieces = surgery.split(base)
    entry = rng.choice(pieces.table["tensors"])
    part = rng.choice(sorted(entry["parts"]))
    offset, length = entry["parts"][part]
    action = rng.choice(["nan", "inf", "tail", "gap", "byte"])
    if action in ("nan", "inf"):
        at = offset + 2 * rng.randrange(length // 2)
        pieces.payload[at:at + 2] = struct.pack("<H", 0x7E00 if action == "nan" else 0x7C00)
    elif action == "tail":          # the last byte of a row of codes
        pieces.payload[offset + length - 1] |= rng.choice([0x01, 0x10, 0xF0])
    elif action == "gap" and offset > 0:
        pieces.payload[offset - 1] = rng.randrange(1, 256)
    else:
        pieces.payload[offset + rng.randrange(length)] = rng.randrange(256)
    data = surgery.join(pieces, rehash=rng.random() < 0.9)
    return data


def length(rng, base):
    action = rng.choice(["cut", "grow", "grow-rehashed"])
    if action == "cut":
        return base[:rng.randrange(len(base))]
    extra = bytes(rng.choice([1, 31, 32, 256]))
    if action == "grow":
        return base + extra
    body = base[:-fmt.TRAILER_LENGTH] + extra
    return body + hashlib.sha256(body).digest()


MUTATORS = {"manifest": manifest_value, "table": table_value, "header": header, "bytes": byte_flips,
            "payload": payload, "json-text": json_text, "length": length, "keys": keys}
