"""The .slm v1 validator: untrusted bytes in, a ValidatedModel or a typed ArtifactError out.

It works on bytes as they arrive (the page streams a download): the header is checked on
the first 128 bytes, the manifest and tensor table as soon as they are complete (so a bad
file is usually rejected long before its payload has arrived), each tensor's sha256 as soon
as its last byte is in, and the whole-file sha256 at the end.

    v = Validator()
    for chunk in chunks: v.feed(chunk)
    model = v.finish()            # or: validate_bytes(data), validate_file(path)

Python integers do not overflow, so "checked arithmetic" here means every size and offset
is bounded by the header's declared lengths and the format limits before it is used; no
allocation happens before the header has been checked. The header's file_length is a claim:
where the real size is known (bytes in hand, a file's size, a Content-Length) it must equal
it, and only then is the buffer allocated at once; otherwise the buffer grows as bytes
arrive, so a 128-byte file that claims 16 GiB costs 128 bytes. Whatever goes wrong inside,
the caller sees an ArtifactError with a code (_coded), never another exception. numpy
(present in CPython and in Pyodide) is used only for the vectorized value scans: finite
scales/mins/floats and zero tail padding.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import types
from typing import Any

from . import format as fmt
from . import schema
from .errors import ArtifactError
from .model import (ModelIdentity, QuantDescriptor, TensorInfo, ValidatedModel,
                    ValidatedModelManifest, freeze)
from .writer import canonical_json

MANIFEST_KEYS = ("format", "version", "architecture", "tokenizer", "chat_template", "generation", "source")
ENTRY_KEYS = ("name", "shape", "encoding", "quant", "row_stride", "parts", "sha256")
QUANT_KEYS = ("block_elements", "blocks_per_row", "tail_elements", "scale_type", "scale_layout", "zero",
              "zero_offset", "min_type", "code_signedness", "nibble_order")
SUPER_BLOCK_KEYS = QUANT_KEYS + ("sub_block_elements", "sub_scale_type", "sub_min_type")
# The zero kinds each quantized encoding defines (format.PARTS has a part list for each).
ZEROS = {"q8": ("none",), "q4": ("offset", "min"), "q5": ("offset", "min"),
         "q4k": ("scaled-min",), "q5k": ("scaled-min",), "q6k": ("offset",)}


class Validator:
    def __init__(self, max_bytes: int = fmt.MAX_FILE_BYTES, expected_bytes: int | None = None):
        """expected_bytes: the file's real size where the caller knows it (None: unknown)."""
        self.max_bytes = max_bytes
        self.expected_bytes = expected_bytes
        self.received = 0
        self._head = bytearray()          # bytes before the header is parsed
        self._data: bytearray | None = None   # [file_length] when preallocated, else what arrived
        self._grows = False               # the size was not known: _data grows chunk by chunk
        self._failed: ArtifactError | None = None   # once set, every call raises it again
        self._header: dict | None = None
        self._tables: tuple | None = None  # (manifest_json, architecture, entries, infos)
        self._file_digest = hashlib.sha256()
        self._hashed_to = 0                # file bytes fed to _file_digest
        self._next_part = 0                # index into _parts of the first unhashed part
        self._parts: list[tuple[int, int, int, str]] = []   # (offset, length, tensor index, part)
        self._tensor_digests: list[Any] = []

    # -- input ---------------------------------------------------------------------------
    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        with _coded(self):
            self._feed(chunk)

    def finish(self) -> ValidatedModel:
        with _coded(self):
            return self._finish()

    def _feed(self, chunk) -> None:
        chunk = memoryview(chunk).cast("B")
        if self._data is None:
            self._head += chunk
            if len(self._head) < fmt.HEADER_LENGTH:
                self.received = len(self._head)
                return
            self._header = _parse_header(bytes(self._head[:fmt.HEADER_LENGTH]), self.max_bytes)
            self._data = self._buffer(self._header["file_length"])
            chunk, self._head = memoryview(bytes(self._head)), bytearray()
            self.received = 0
        end = self.received + len(chunk)
        if end > self._header["file_length"]:
            raise ArtifactError("trailing-bytes", "file", f"more than the declared {self._header['file_length']} bytes")
        if self._grows:
            self._data += chunk
        else:
            self._data[self.received:end] = chunk
        self.received = end
        self._advance()

    def _buffer(self, file_length: int) -> bytearray:
        """The buffer the file is copied into: all of it at once when the real size is known
        and equals the header's claim; else empty, grown as bytes arrive."""
        real = self.expected_bytes
        if real is None:
            self._grows = True
            return bytearray()
        if real < file_length:
            raise ArtifactError("truncated", "header.file_length",
                                f"the header declares {file_length} bytes, the file has {real}")
        if real > file_length:
            raise ArtifactError("trailing-bytes", "header.file_length",
                                f"the header declares {file_length} bytes, the file has {real}")
        return bytearray(file_length)

    def _finish(self) -> ValidatedModel:
        if self._data is None or self.received < self._header["file_length"]:
            total = self._header["file_length"] if self._data is not None else fmt.HEADER_LENGTH
            raise ArtifactError("truncated", "file", f"got {self.received or len(self._head)} of {total} bytes")
        data = self._data
        manifest, arch, entries, infos = self._tables
        _check_values(data, infos)   # the specific defects first; the file hash catches the rest
        if self._file_digest.digest() != bytes(data[-fmt.TRAILER_LENGTH:]):
            raise ArtifactError("file-hash", "trailer", "the whole-file sha256 does not match the content")
        layout_hash = hashlib.sha256(canonical_json({
            "architecture": manifest["architecture"],
            "tensors": [{k: e[k] for k in ("name", "shape", "encoding", "quant", "row_stride", "sha256")}
                        for e in entries]})).hexdigest()
        identity = ModelIdentity(artifact_sha256=data[-fmt.TRAILER_LENGTH:].hex(), layout_hash=layout_hash)
        validated = ValidatedModelManifest(
            architecture=arch, tokenizer=freeze(manifest["tokenizer"]),
            chat_template=freeze(manifest["chat_template"]), generation=freeze(manifest["generation"]),
            source=freeze(manifest["source"]), tensors=types.MappingProxyType({i.name: i for i in infos}),
            identity=identity)
        return ValidatedModel(validated, data)

    # -- progress as bytes arrive ----------------------------------------------------------
    def _advance(self) -> None:
        h, data = self._header, self._data
        if self._tables is None and self.received >= h["payload_offset"]:
            self._tables = _parse_tables(data, h)
            for index, info in enumerate(self._tables[3]):
                self._tensor_digests.append(hashlib.sha256())
                self._parts.extend((offset, length, index, part) for part, offset, length in info.parts)
        # whole-file hash: everything but the trailer. Views are released before returning:
        # a bytearray with a live view cannot grow.
        stop = min(self.received, h["file_length"] - fmt.TRAILER_LENGTH)
        if stop > self._hashed_to:
            with memoryview(data) as view:
                self._file_digest.update(view[self._hashed_to:stop])
            self._hashed_to = stop
        if self._tables is not None:
            with memoryview(self._data) as view:
                self._hash_parts(view)

    def _hash_parts(self, view: memoryview) -> None:
        infos = self._tables[3]
        while self._next_part < len(self._parts):
            offset, length, index, _ = self._parts[self._next_part]
            if offset + length > self.received:
                return
            self._tensor_digests[index].update(view[offset:offset + length])
            self._next_part += 1
            last_of_tensor = self._next_part == len(self._parts) or self._parts[self._next_part][2] != index
            if last_of_tensor and self._tensor_digests[index].hexdigest() != infos[index].sha256:
                raise ArtifactError("tensor-hash", infos[index].name, "sha256 of the tensor's bytes does not match the table")


@contextlib.contextmanager
def _coded(validator: Validator):
    """Every failure leaves as an ArtifactError with a code, and the validator keeps it: a
    later feed() or finish() raises it again. Anything but an ArtifactError is a check this
    file got past in a way no code names (a huge number, a deep structure, a bug); it is
    refused as "malformed", or "out-of-memory" when the runtime ran out of memory."""
    if validator._failed is not None:
        raise validator._failed
    try:
        yield
        return
    except ArtifactError as exc:
        failure = exc
    except MemoryError:
        failure = ArtifactError("out-of-memory", "file", "this runtime ran out of memory reading the file")
    except Exception as exc:    # noqa: BLE001 - the validator's promise: a code, whatever happened
        failure = ArtifactError("malformed", "file", f"the file could not be read ({type(exc).__name__}: {exc})"[:300])
    validator._failed, validator._data = failure, None     # the partial buffer is of no use now
    raise failure


# -- header --------------------------------------------------------------------------------

def _parse_header(raw: bytes, max_bytes: int) -> dict:
    if raw[:8] != fmt.MAGIC:
        raise ArtifactError("bad-magic", "header.magic", "this is not a .slm file")
    (_, version, header_length, manifest_offset, manifest_length, table_offset, table_length,
     payload_offset, payload_length, file_length, alignment) = fmt.HEADER.unpack_from(raw)
    if version != fmt.VERSION:
        raise ArtifactError("bad-version", "header.format_version", f"version {version}; this reader implements {fmt.VERSION}")
    expect = [
        ("header_length", header_length, fmt.HEADER_LENGTH),
        ("payload_alignment", alignment, fmt.PAYLOAD_ALIGNMENT),
        ("manifest_offset", manifest_offset, fmt.HEADER_LENGTH),
        ("table_offset", table_offset, manifest_offset + manifest_length),
        ("payload_offset", payload_offset, fmt.align_up(table_offset + table_length, fmt.PAYLOAD_ALIGNMENT)),
        ("file_length", file_length, payload_offset + payload_length + fmt.TRAILER_LENGTH),
    ]
    if not 1 <= manifest_length <= fmt.MAX_MANIFEST_BYTES:
        raise ArtifactError("too-large", "header.manifest_length", f"{manifest_length} bytes (1 .. {fmt.MAX_MANIFEST_BYTES})")
    if not 1 <= table_length <= fmt.MAX_TABLE_BYTES:
        raise ArtifactError("too-large", "header.table_length", f"{table_length} bytes (1 .. {fmt.MAX_TABLE_BYTES})")
    for name, got, want in expect:
        if got != want:
            raise ArtifactError("bad-header", f"header.{name}", f"is {got}, must be {want}")
    if file_length > max_bytes:
        raise ArtifactError("too-large", "header.file_length", f"{file_length} bytes exceeds the limit of {max_bytes}")
    if any(raw[fmt.HEADER.size:fmt.HEADER_LENGTH]):
        raise ArtifactError("bad-header", "header.reserved", "reserved bytes must be zero")
    return {"manifest": (manifest_offset, manifest_length), "table": (table_offset, table_length),
            "payload_offset": payload_offset, "payload_length": payload_length, "file_length": file_length}


# -- manifest and tensor table ---------------------------------------------------------------

def _parse_tables(data: bytearray, h: dict) -> tuple:
    (m_off, m_len), (t_off, t_len) = h["manifest"], h["table"]
    if any(data[t_off + t_len:h["payload_offset"]]):
        raise ArtifactError("bad-padding", "table", "padding before the payload must be zero")
    manifest = schema.obj(schema.strict_json(data[m_off:m_off + m_len], "manifest"), "manifest", MANIFEST_KEYS)
    schema.string(manifest["format"], "manifest.format", (fmt.FORMAT_NAME,))
    if manifest["version"] != fmt.VERSION or type(manifest["version"]) is not int:
        raise ArtifactError("bad-version", "manifest.version", f"must be {fmt.VERSION}")
    arch = schema.architecture(manifest["architecture"])
    schema.tokenizer(manifest["tokenizer"], arch.vocab)
    schema.chat_template(manifest["chat_template"])
    schema.generation(manifest["generation"], arch.context_length)
    schema.source(manifest["source"])

    table = schema.obj(schema.strict_json(data[t_off:t_off + t_len], "table"), "table", ("tensors",))
    entries = table["tensors"]
    if not isinstance(entries, list) or len(entries) > fmt.MAX_TENSORS:
        raise ArtifactError("bad-field", "table.tensors", f"must be a list of at most {fmt.MAX_TENSORS} entries")
    required = fmt.required_tensors(manifest["architecture"])
    infos, seen, cursor = [], set(), 0
    for n, entry in enumerate(entries):
        info, cursor = _tensor_info(entry, n, required, seen, cursor, h)
        infos.append(info)
    missing = [name for name in required if name not in seen]
    if missing:
        raise ArtifactError("missing-tensor", missing[0], f"required by the architecture ({len(missing)} missing)")
    if cursor != h["payload_length"]:
        raise ArtifactError("bad-layout", "header.payload_length",
                            f"is {h['payload_length']}, but the last part ends at {cursor}")
    return manifest, arch, entries, infos


def _tensor_info(entry: Any, n: int, required: dict, seen: set, cursor: int, h: dict) -> tuple[TensorInfo, int]:
    where = f"table.tensors[{n}]"
    e = schema.obj(entry, where, ENTRY_KEYS)
    name = schema.string(e["name"], f"{where}.name", max_len=256)
    if name in seen:
        raise ArtifactError("duplicate-tensor", name, "appears twice in the table")
    if name not in required:
        raise ArtifactError("unexpected-tensor", name, "is not part of this architecture")
    seen.add(name)
    shape = e["shape"]
    if not isinstance(shape, list) or tuple(shape) != required[name] or not all(type(d) is int for d in shape):
        raise ArtifactError("bad-shape", name, f"shape {shape!r} must be {list(required[name])}"[:200])
    shape = tuple(shape)
    encoding = schema.string(e["encoding"], f"{name}.encoding", fmt.ENCODINGS)
    if encoding not in ("f32", "f16") and len(shape) == 1:
        raise ArtifactError("bad-encoding", name, "vectors must be f32 or f16")
    quant = _quant(e["quant"], name, encoding, shape[-1])
    block = quant.block_elements if quant else None
    if type(e["row_stride"]) is not int or e["row_stride"] != fmt.row_stride(encoding, shape[-1], block):
        raise ArtifactError("bad-layout", f"{name}.row_stride",
                            f"is {e['row_stride']!r}, must be {fmt.row_stride(encoding, shape[-1], block)}"[:200])
    rows = shape[0] if len(shape) == 2 else 1
    scale_bytes = 4 if quant and quant.scale_type == "f32" else 2
    lengths = fmt.part_lengths(encoding, quant.zero if quant else "none", rows, shape[-1], block, scale_bytes)
    parts = e["parts"]
    # JSON key order means nothing (canonical JSON sorts keys); file order is the format's order
    if not isinstance(parts, dict) or sorted(parts) != sorted(lengths):
        raise ArtifactError("bad-layout", f"{name}.parts", f"must have exactly the parts {', '.join(lengths)}")
    placed = []
    for part, want_length in lengths.items():
        span = parts[part]
        if not isinstance(span, list) or len(span) != 2 or not all(type(v) is int for v in span):
            raise ArtifactError("bad-layout", f"{name}.parts.{part}", "must be [offset, length]")
        offset, length = span
        if length != want_length:
            raise ArtifactError("bad-layout", f"{name}.parts.{part}", f"length {length}, must be {want_length}")
        if offset < cursor:
            raise ArtifactError("overlap", f"{name}.parts.{part}", f"starts at {offset}, before the previous part ends at {cursor}")
        if offset != fmt.align_up(cursor, fmt.PAYLOAD_ALIGNMENT):
            raise ArtifactError("bad-layout", f"{name}.parts.{part}",
                                f"offset {offset} must be {fmt.align_up(cursor, fmt.PAYLOAD_ALIGNMENT)} (the next 256-byte boundary)")
        if offset + length > h["payload_length"]:
            raise ArtifactError("bad-layout", f"{name}.parts.{part}", "extends past the payload")
        placed.append((part, h["payload_offset"] + offset, length))
        cursor = offset + length
    sha = schema.sha256_hex(e["sha256"], f"{name}.sha256")
    return TensorInfo(name, shape, encoding, quant, e["row_stride"], tuple(placed), sha), cursor


def _quant(value: Any, name: str, encoding: str, cols: int) -> QuantDescriptor | None:
    if encoding in ("f32", "f16"):
        if value is not None:
            raise ArtifactError("bad-encoding", f"{name}.quant", f"must be null for {encoding}")
        return None
    super_block = encoding in fmt.SUB_BLOCK_ELEMENTS
    keys = SUPER_BLOCK_KEYS if super_block else QUANT_KEYS
    q = schema.obj(value, f"{name}.quant", keys)
    block = q["block_elements"]
    allowed_blocks = (fmt.SUPER_BLOCK_ELEMENTS,) if super_block else fmt.BLOCK_ELEMENTS
    if block not in allowed_blocks or type(block) is not int:
        raise ArtifactError("bad-encoding", f"{name}.quant.block_elements", f"must be one of {allowed_blocks} for {encoding}")
    if encoding in fmt.WHOLE_BLOCKS and cols % block:
        raise ArtifactError("bad-encoding", f"{name}.quant.block_elements",
                            f"{encoding} rows hold whole blocks only: {cols} columns are not a multiple of {block}")
    zero = schema.string(q["zero"], f"{name}.quant.zero", ("none", "offset", "min", "scaled-min"))
    if zero not in ZEROS[encoding]:
        raise ArtifactError("bad-encoding", f"{name}.quant.zero", f"{zero!r} is not defined for {encoding}"[:200])
    scale_types = ("f16",) if super_block else ("f16", "f32")
    if q["scale_type"] not in scale_types:
        raise ArtifactError("bad-encoding", f"{name}.quant.scale_type", f"must be {' or '.join(scale_types)} for {encoding}")
    expected = {
        "blocks_per_row": fmt.blocks_per_row(cols, block),
        "tail_elements": fmt.tail_elements(cols, block),
        "scale_layout": "rows-by-blocks",
        "code_signedness": "signed" if encoding == "q8" else "unsigned",
        "nibble_order": None if encoding == "q8" else "low-first",
        "zero_offset": fmt.ZERO_OFFSETS[encoding] if zero == "offset" else None,
        "min_type": q["scale_type"] if zero in ("min", "scaled-min") else None,
    }
    if super_block:
        expected |= {"sub_block_elements": fmt.SUB_BLOCK_ELEMENTS[encoding],
                     "sub_scale_type": fmt.SUB_SCALE_TYPES[encoding],
                     "sub_min_type": fmt.SUB_SCALE_TYPES[encoding] if zero == "scaled-min" else None}
    for key, want in expected.items():
        if q[key] != want or type(q[key]) is not type(want):
            raise ArtifactError("bad-encoding", f"{name}.quant.{key}", f"is {q[key]!r}, must be {want!r}"[:200])
    return QuantDescriptor(**{k: q[k] for k in keys})


# -- values (numpy) --------------------------------------------------------------------------

def _check_values(data: bytearray, infos: list[TensorInfo]) -> None:
    """Finite scales/mins/floats; zero padding in tails, row ends and between parts."""
    import numpy as np
    view = memoryview(data)
    previous_end = None
    for info in infos:
        for part, offset, length in info.parts:
            if previous_end is not None and any(view[previous_end:offset]):
                raise ArtifactError("bad-padding", f"{info.name}.parts.{part}", "padding before this part must be zero")
            previous_end = offset + length
        parts = {part: view[offset:offset + length] for part, offset, length in info.parts}
        rows, cols = info.rows, info.cols
        if info.encoding in ("f32", "f16"):
            dtype = "<f4" if info.encoding == "f32" else "<f2"
            values = np.frombuffer(parts["data"], dtype).reshape(rows, -1)
            if not np.isfinite(values[:, :cols]).all():
                raise ArtifactError("non-finite", info.name, "contains NaN or infinity")
            if values.shape[1] > cols and values[:, cols:].view(np.uint16).any():
                raise ArtifactError("bad-padding", info.name, "row padding must be zero")
            continue
        q = info.quant
        dtype = "<f2" if q.scale_type == "f16" else "<f4"
        for side in ("scales", "mins"):
            if side in parts and not np.isfinite(np.frombuffer(parts[side], dtype)).all():
                raise ArtifactError("non-finite", f"{info.name}.{side}", "contains NaN or infinity")
        for side, kind in (("sub_scales", q.sub_scale_type), ("sub_mins", q.sub_min_type)):
            # u6 values are 6-bit fields (GGUF packs 16 of them in 12 bytes): a larger one has no GGUF form
            if kind == "u6" and np.frombuffer(parts[side], np.uint8).max(initial=0) > 63:
                raise ArtifactError("out-of-range", f"{info.name}.{side}", "u6 values must be 0..63")
        padded = q.blocks_per_row * q.block_elements
        if padded > cols:
            codes = np.frombuffer(parts["codes"], np.uint8).reshape(rows, info.row_stride)
            if info.encoding == "q8":
                tail = codes[:, cols:]
            else:   # q4 (the only other encoding with partial blocks): element k is nibble k % 2 of byte k // 2
                first = cols // 2
                tail = codes[:, first + 1:] if cols % 2 else codes[:, first:]
                if cols % 2 and (codes[:, first] >> 4).any():
                    raise ArtifactError("bad-tail", info.name, "padding codes of the last block must be zero")
            if tail.any():
                raise ArtifactError("bad-tail", info.name, "padding codes of the last block must be zero")


# -- entry points ------------------------------------------------------------------------------

def validate_bytes(data: bytes | bytearray | memoryview) -> ValidatedModel:
    data = memoryview(data).cast("B")
    validator = Validator(expected_bytes=len(data))
    validator.feed(data)
    return validator.finish()


def validate_file(path: str | os.PathLike, chunk_bytes: int = 8 << 20) -> ValidatedModel:
    """Raises OSError when the file cannot be read (a directory, no permission, ...)."""
    with open(path, "rb") as handle:
        validator = Validator(expected_bytes=os.fstat(handle.fileno()).st_size)
        while chunk := handle.read(chunk_bytes):
            validator.feed(chunk)
    return validator.finish()
