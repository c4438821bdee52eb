"""Typed artifact errors: a stable code, where (field or tensor), and a sentence for people.

Codes are part of the format's contract (docs/slm-format.md lists them); tests assert them,
the CLI prints them, the page explains them. Add codes; never reuse or rename one.
"""
from __future__ import annotations

from ..errors import CodedError


class ArtifactError(CodedError):
    """The artifact is invalid; `code` is one of CODES."""


# Every code the validator can raise, with what it means.
CODES = {
    "truncated": "the file ends before a region it declares",
    "too-large": "a declared size exceeds a format limit",
    "bad-magic": "the file does not start with the .slm magic bytes",
    "bad-version": "a format version this reader does not implement",
    "bad-header": "a header field is inconsistent (offsets, lengths, alignment, reserved bytes)",
    "bad-padding": "padding between regions is not all zero",
    "trailing-bytes": "bytes after the declared end of the file",
    "file-hash": "the whole-file sha256 in the trailer does not match the content",
    "bad-json": "the manifest or tensor table is not strict UTF-8 JSON (duplicate keys, NaN, ...)",
    "bad-field": "a manifest or table field is missing, unknown, of the wrong type or out of range",
    "bad-architecture": "architecture fields contradict each other",
    "bad-tokenizer": "the tokenizer section is inconsistent",
    "missing-tensor": "a tensor the architecture requires is absent",
    "unexpected-tensor": "a tensor the architecture does not use is present",
    "duplicate-tensor": "two table entries share a name",
    "bad-shape": "a tensor's shape does not match the architecture",
    "bad-encoding": "an encoding or quantization descriptor is not allowed or is inconsistent",
    "bad-layout": "a part's offset, length, stride or alignment is wrong",
    "overlap": "two parts share payload bytes, or parts are out of order",
    "bad-tail": "the padding codes of a partial last block are not zero",
    "tensor-hash": "a tensor's sha256 does not match its bytes",
    "non-finite": "a scale, min or float weight is NaN or infinite",
    "out-of-range": "a stored integer field holds a value outside its declared range (u6 sub-scales)",
    "out-of-memory": "the runtime ran out of memory reading the file",
    "malformed": "the file broke a check in a way no other code names (a number or nesting past what "
                 "the reader handles); it is refused",
}
