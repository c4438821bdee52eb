"""A loaded model: the validated artifact joined with its semantic objects.

`webslm.open_model(path_or_bytes)` returns a Model. The artifact layer (validation, tensors)
and the semantic layer (tokenizer, chat template) stay independent of each other; this is
the one place that puts them together.
"""
from __future__ import annotations

import functools

from .artifact import ValidatedModel


class Model:
    def __init__(self, artifact: ValidatedModel):
        self.artifact = artifact
        self.manifest = artifact.manifest
        self.identity = artifact.identity
        self.architecture = artifact.architecture

    @functools.cached_property
    def tokenizer(self):
        from .semantic.tokenizer import Tokenizer
        return Tokenizer.from_manifest(self.manifest.tokenizer)

    @functools.cached_property
    def chat_template(self):
        from .semantic.chat_template import ChatTemplate
        t = self.manifest.tokenizer
        tokens = t["tokens"]
        bos = tokens[t["bos_id"]] if t["bos_id"] is not None else None
        eos = tokens[t["eos_ids"][0]]
        return ChatTemplate(self.manifest.chat_template["template"], bos_token=bos, eos_token=eos)

    def tensor_parts(self, name: str):
        return self.artifact.tensor_parts(name)

    def tensor_arrays(self, name: str):
        return self.artifact.tensor_arrays(name)

    def dequantize(self, name: str):
        return self.artifact.dequantize(name)

    def __repr__(self) -> str:
        return repr(self.artifact).replace("ValidatedModel", "Model", 1)
