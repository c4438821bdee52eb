"""Tokenize texts with llama.cpp itself (the peer), for tests/test_tokenizer_llama_cpp.py.

Runs under an interpreter that can import llama-cpp-python's `llama_cpp` (the peer venv that
tools/build_peer.sh makes, or the sdist's `llama_cpp` package on PYTHONPATH with
LLAMA_CPP_LIB_PATH naming a folder holding a libllama.so built from the same sdist):

    .venv-peer/bin/python tools/llama_tokenize.py < request.json > answer.json

request: {"model": "path.gguf", "texts": [...], "add_special": true, "parse_special": true};
answer:  {"ids": [[...], ...], "system": "llama.cpp's build info"}.

Only the vocabulary is loaded (vocab_only: no weights are read), through llama.cpp's C API
(llama_tokenize), not the Python wrapper's helpers, so what is compared is llama.cpp's own
tokenizer: its pre-tokenizer regexes per `tokenizer.ggml.pre`, its BPE/SentencePiece merges
and its special-token parsing.
"""
from __future__ import annotations

import ctypes
import json
import sys


def low_level_api():
    """llama_cpp.llama_cpp (the ctypes bindings) without the package's __init__, which also
    imports the high-level wrapper and its dependencies (diskcache, ...) that this needs not."""
    import importlib
    import importlib.util
    import types
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'llama_cpp'")
    package = types.ModuleType("llama_cpp")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["llama_cpp"] = package
    return importlib.import_module("llama_cpp.llama_cpp")


def main() -> int:
    ll = low_level_api()
    request = json.load(sys.stdin)
    quiet = ll.llama_log_callback(lambda *_: None)   # kept referenced: llama.cpp calls it later
    ll.llama_log_set(quiet, ctypes.c_void_p())
    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    params.vocab_only = True
    model = ll.llama_model_load_from_file(request["model"].encode(), params)
    if not model:
        print(f"llama_tokenize: llama.cpp could not load {request['model']}", file=sys.stderr)
        return 2
    vocab = ll.llama_model_get_vocab(model)
    answers = []
    for text in request["texts"]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            buffer = (ll.llama_token * capacity)()
            n = ll.llama_tokenize(vocab, data, len(data), buffer, capacity,
                                  bool(request["add_special"]), bool(request["parse_special"]))
            if n >= 0:
                answers.append(list(buffer[:n]))
                break
            capacity = -n        # llama.cpp says how many it needs
    ll.llama_model_free(model)
    json.dump({"ids": answers, "system": ll.llama_print_system_info().decode()}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
