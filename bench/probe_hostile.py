"""Issue 18's probes of hostile input, rerunnable: files, chat templates, prompts, CLI, worker.

    .venv/bin/python bench/probe_hostile.py [--cases 10600] [--sections files,templates,prompts,cli,worker]
                                            [--out bench/results/probe_hostile.json]

Each section counts what must never happen; all counts are 0 when webslm holds:

- files: --cases mutated fixture models (tests/slm_mutate.py) through webslm.open_model(bytes):
  untyped exceptions (anything but ArtifactError), MemoryError, memory blow-ups (traced peak
  over 2x the file's size + 8 MiB), false acceptances (tests/slm_oracle.py says invalid, the
  validator accepted) and accepted-then-crash (a model that validated, then failed in its
  tokenizer, decoder, chat template or a 2-token CPU answer with an untyped exception). A
  typed error there (a SamplerError for non-finite logits: finite but huge weights overflow
  in the forward pass; the format allows them) is counted apart, as accepted-then-typed-error.
- templates: hostile chat templates, each in its own process (6 GiB address-space limit, 30 s):
  untyped errors, renders over 2 s, traced peaks over 256 MiB.
- prompts: 20 MB of text and 39 x 100k-emoji messages against SmolLM2's 8192-token context
  (the default model from set-up): seconds and peak RSS growth until the prompt is refused
  (or, before the bound, accepted far past the context).
- cli: bad arguments and bad files through `webslm generate/validate/inspect`: tracebacks,
  exit status 0 on a failure, and more than one line on stderr.
- worker: bad generation requests through the worker's EngineHost (CPU engine): errors that
  are not RequestError (the page gets "failed", not a typed reply), and coerced settings.

serve.py has its own probe (bench/probe_serve.py). Prints a summary; writes --out.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc

ROOT = pathlib.Path(__file__).resolve().parents[1]
PY = pathlib.Path(os.environ.get("WEBSLM_PY", ROOT / "py"))   # another tree's webslm: its "before"
sys.path[:0] = [str(ROOT / "tests"), str(PY)]

ADDRESS_SPACE = 6 << 30       # a probe that allocates what a file claims fails here, not the machine


def fixture_bytes() -> bytes:
    from webslm.fixture import make_fixture
    with tempfile.TemporaryDirectory() as tmp:
        make_fixture(f"{tmp}/fixture.slm")
        return pathlib.Path(f"{tmp}/fixture.slm").read_bytes()


# -- files -----------------------------------------------------------------------------------------

def use_model(model) -> None:
    """What a page does with a model it accepted: tokenizer, decoder, template, 2 tokens."""
    import numpy as np

    from webslm.cpu import CpuBackend
    from webslm.generate import generate
    from webslm.request import sampler_settings
    from webslm.semantic.chat_template import TemplateError
    np.seterr(all="ignore")             # mutated weights may overflow: the sampler says so, typed
    tokenizer = model.tokenizer
    specials = "".join(tokenizer.tokens[i] for i in sorted(tokenizer.special_ids))
    ids = tokenizer.encode("Hello, world! 12 é 😀 " + specials)
    tokenizer.decode(range(len(tokenizer.tokens)))
    try:
        text = model.chat_template.render([{"role": "user", "content": "Hi"}])
        ids = tokenizer.encode(text, add_special=False) or ids
    except TemplateError:
        pass
    settings = sampler_settings(model, {"max_tokens": 2, "seed": 1})
    for _ in generate(model, CpuBackend(model), (ids or [0])[:model.architecture.context_length - 2], settings):
        pass


def probe_files(cases: int, seed: int = 18) -> dict:
    import webslm
    import slm_mutate
    import slm_oracle
    from webslm.artifact import ArtifactError
    base = fixture_bytes()
    rng = random.Random(seed)
    from webslm.errors import CodedError
    counts = {"cases": 0, "typed": 0, "accepted": 0, "untyped": 0, "memory_error": 0, "memory_blowup": 0,
              "false_acceptance": 0, "false_rejection": 0, "accepted_then_crash": 0, "accepted_then_typed_error": 0}
    examples: dict[str, list] = {}
    started = time.perf_counter()
    for case in range(cases):
        kind, data = slm_mutate.mutate(rng, base)
        verdict = slm_oracle.violation(data)
        tracemalloc.start()
        outcome, model = None, None
        try:
            model = webslm.open_model(data)
            outcome = "accepted"
        except ArtifactError as exc:
            outcome = f"typed:{exc.code}"
        except MemoryError:
            outcome = "memory_error"
        except Exception as exc:        # noqa: BLE001 - what the probe counts
            outcome = f"untyped:{type(exc).__name__}: {str(exc)[:80]}"
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        counts["cases"] += 1
        key = outcome.split(":")[0]
        counts[key] = counts.get(key, 0) + 1
        if peak > 2 * len(data) + (8 << 20):
            note(counts, examples, "memory_blowup", f"case {case} {kind}: {len(data)} bytes, traced peak {peak >> 20} MiB")
        if key == "accepted" and verdict is not None:
            note(counts, examples, "false_acceptance", f"case {case} {kind}: {verdict}")
        if key != "accepted" and verdict is None:
            note(counts, examples, "false_rejection", f"case {case} {kind}: {outcome}")
        if key in ("untyped", "memory_error"):
            examples.setdefault(key, []).append(f"case {case} {kind}: {outcome}")
        if model is not None:
            try:
                use_model(model)
            except Exception as exc:    # noqa: BLE001
                key = "accepted_then_typed_error" if isinstance(exc, CodedError) else "accepted_then_crash"
                note(counts, examples, key, f"case {case} {kind}: {type(exc).__name__}: {str(exc)[:80]}")
    counts["seconds"] = round(time.perf_counter() - started, 1)
    return {"counts": counts, "examples": {k: v[:8] for k, v in examples.items()}, "claims": probe_claims(base)}


def note(counts: dict, examples: dict, key: str, text: str) -> None:
    counts[key] += 1
    examples.setdefault(key, []).append(text)


def probe_claims(base: bytes) -> list[dict]:
    """A header-only file (128 bytes) whose header claims 2 GiB and 16 GiB; and a token with a
    lone surrogate (validates, then generate crashes?)."""
    import webslm
    import slm_surgery as surgery
    from webslm.artifact import format as fmt
    rows = []
    payload_offset = fmt.HEADER.unpack_from(base)[7]
    for claim in (2 << 30, (16 << 30) - (1 << 20)):
        head = surgery.join(surgery.split(base), header={"payload_length": claim,
                                                        "file_length": payload_offset + claim + 32})[:128]
        rows.append({"probe": f"128-byte file claiming {claim >> 30} GiB", **traced(lambda head=head: webslm.open_model(head))})
    pieces = surgery.split(base)
    pieces.manifest["tokenizer"]["tokens"][5] = "a\ud800"
    import slm_mutate
    raw = slm_mutate.dumps(pieces.manifest, random.Random(0))
    bad = surgery.join(pieces, manifest_bytes=raw)
    rows.append({"probe": "a token string with a lone surrogate, then a 2-token answer",
                 **traced(lambda: use_model(webslm.open_model(bad)))})
    return rows


def traced(call) -> dict:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        call()
        outcome = "ok"
    except MemoryError:
        outcome = "MemoryError"
    except Exception as exc:            # noqa: BLE001
        code = getattr(exc, "code", None)
        outcome = f"{type(exc).__name__}" + (f" ({code})" if code else f": {str(exc)[:100]}")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"outcome": outcome, "seconds": round(time.perf_counter() - started, 3), "peak_mib": round(peak / 2**20, 1)}


# -- templates -------------------------------------------------------------------------------------

HOSTILE_TEMPLATES = {
    "%-mapping width": "{{ '%(a)999999999s' % {'a': 1} }}",
    "%-width via `is odd`": "{{ '%1900000000d' is odd }}",
    "%-width via divisibleby": "{{ '%1900000000d' is divisibleby 3 }}",
    "%-star width": "{{ '%*d' % (999999999, 1) }}",
    "%-repeated spec": "{{ ('%(a)9999s' * 300000) % {'a': 1} }}",
    "%-precision": "{{ '%.999999999f' % 1.0 }}",
    "tojson separators": "{{ range(100000)|list|tojson(separators=('x' * 20000, ':')) }}",
    "tojson deep indent": "{% set ns = namespace(v=range(30000)|list) %}{% for i in range(39) %}"
                          "{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v|tojson(indent=64) }}",
    "replace in a loop": "{% set s = 'a' * 3999999 %}{% for i in range(100000) %}{% set t = s.replace('a', 'b') %}{% endfor %}",
    "count in a loop": "{% set s = 'ab' * 1999999 %}{% for i in range(100000) %}{{ s.count('b') and '' }}{% endfor %}",
    "in-test in a loop": "{% set s = 'a' * 3999999 %}{% for i in range(100000) %}{% if 'b' in s %}x{% endif %}{% endfor %}",
    "split amplification": "{{ ((' a' * 1999999).split())|length }}",
    "upper in a loop": "{% set s = 'a' * 3999999 %}{% for i in range(100000) %}{% set t = s|upper %}{% endfor %}",
    "concat in a loop": "{% set s = 'a' * 3000000 %}{% for i in range(100000) %}{% set t = s ~ s %}{% endfor %}",
    "compare in a loop": "{% set s = 'a' * 3999999 %}{% set u = 'a' * 3999999 %}{% for i in range(100000) %}"
                         "{% if s == u %}{% endif %}{% endfor %}",
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "deep nesting": "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "int power": "{{ 7 ** 99999999 }}",
    "string repeat": "{{ 'a' * 999999999 }}",
    "undefined call": "{{ foo() }}",
    "dunder": "{{ messages.__class__ }}",
}

TEMPLATE_CHILD = """
import json, sys, time, tracemalloc
sys.path.insert(0, {py!r})
from webslm.semantic.chat_template import ChatTemplate, TemplateError
tracemalloc.start(); started = time.perf_counter()
try:
    ChatTemplate(sys.argv[1]).render([{{"role": "user", "content": "hi"}}])
    outcome = "rendered"
except TemplateError as exc:
    outcome = "typed:" + type(exc).__name__ + ": " + str(exc)[:80]
except MemoryError:
    outcome = "untyped:MemoryError"
except BaseException as exc:
    outcome = "untyped:" + type(exc).__name__
print(json.dumps({{"outcome": outcome, "seconds": round(time.perf_counter() - started, 3),
                  "peak_mib": round(tracemalloc.get_traced_memory()[1] / 2**20, 1)}}))
"""


def limited():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def probe_templates(timeout_s: float = 30) -> dict:
    rows, counts = [], {"templates": 0, "untyped": 0, "over_2s": 0, "over_256_mib": 0, "timed_out": 0}
    for name, source in HOSTILE_TEMPLATES.items():
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-c", TEMPLATE_CHILD.format(py=str(PY)), source],
                                  capture_output=True, text=True, timeout=timeout_s, preexec_fn=limited)
            row = json.loads(done.stdout) if done.stdout.strip() else {
                "outcome": f"crashed: {done.stderr.strip().splitlines()[-1:]}", "seconds": None, "peak_mib": None}
        except subprocess.TimeoutExpired:
            row = {"outcome": "timed-out", "seconds": round(time.perf_counter() - started, 1), "peak_mib": None}
            counts["timed_out"] += 1
        rows.append({"template": name, **row})
        counts["templates"] += 1
        counts["untyped"] += not row["outcome"].startswith(("typed", "rendered"))
        counts["over_2s"] += row["seconds"] is None or row["seconds"] > 2
        counts["over_256_mib"] += (row["peak_mib"] or 0) > 256
    return {"counts": counts, "rows": rows}


# -- prompts ---------------------------------------------------------------------------------------

PROMPT_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {py!r})
import webslm
from webslm.request import prompt_ids
model = webslm.open_model({model!r})
model.tokenizer; model.chat_template
which = sys.argv[1]
prompt = "The quick brown fox. 12345 " * (20_000_000 // 27) if which == "text" else \\
         [{{"role": "user", "content": "\\U0001f600" * 100_000}} for _ in range(39)]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
try:
    ids = prompt_ids(model, prompt, chat=which != "text")
    outcome = f"accepted {{len(ids)}} tokens (context {{model.architecture.context_length}})"
except Exception as exc:
    outcome = type(exc).__name__ + ": " + str(exc)[:120]
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({{"outcome": outcome, "seconds": round(time.perf_counter() - started, 2),
                  "peak_rss_growth_mib": round(grown / 1024, 1)}}))
"""


def default_model() -> pathlib.Path | None:
    manifest = ROOT / ".assets/site/manifest.json"
    if not manifest.is_file():
        return None
    entry = next(m for m in json.loads(manifest.read_text())["models"] if m.get("default"))
    return ROOT / ".assets/site" / entry["file"]


def probe_prompts(timeout_s: float = 900) -> dict:
    model = default_model()
    if model is None:
        return {"skipped": "no default model: run python tools/assets.py"}
    rows = []
    for which in ("text", "messages"):
        try:
            done = subprocess.run([sys.executable, "-c", PROMPT_CHILD.format(py=str(PY), model=str(model)), which],
                                  capture_output=True, text=True, timeout=timeout_s, preexec_fn=limited)
            row = json.loads(done.stdout) if done.stdout.strip() else {"outcome": done.stderr.strip()[-200:]}
        except subprocess.TimeoutExpired:
            row = {"outcome": f"still tokenizing after {timeout_s} s"}
        rows.append({"prompt": "20 MB of text" if which == "text" else "39 x 100k-emoji messages", **row})
    return {"rows": rows}


# -- CLI -------------------------------------------------------------------------------------------

def probe_cli(base: bytes) -> dict:
    import slm_surgery as surgery
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="probe-cli-"))
    good = tmp / "fixture.slm"
    good.write_bytes(base)
    broken_template = surgery.split(base)
    broken_template.manifest["chat_template"]["template"] = "{% for %}"
    (tmp / "template.slm").write_bytes(surgery.join(broken_template))
    hostile_template = surgery.split(base)
    hostile_template.manifest["chat_template"]["template"] = HOSTILE_TEMPLATES["%-mapping width"]
    (tmp / "hostile.slm").write_bytes(surgery.join(hostile_template))
    (tmp / "junk.slm").write_bytes(os.urandom(4096))
    (tmp / "truncated.slm").write_bytes(base[:5000])
    gen = ["generate", "--model", str(good), "--prompt", "Hi"]
    cases = {
        "max-tokens 0": gen + ["--max-tokens", "0"],
        "max-tokens -1": gen + ["--max-tokens", "-1"],
        "temperature -1": gen + ["--temperature", "-1"],
        "temperature nan": gen + ["--temperature", "nan"],
        "temperature inf": gen + ["--temperature", "inf"],
        "seed -1": gen + ["--seed", "-1"],
        "seed 2**64": gen + ["--seed", str(2**64)],
        "seed abc": gen + ["--seed", "abc"],
        "empty stop": gen + ["--stop", ""],
        "invalid UTF-8 prompt": ["generate", "--model", str(good), "--prompt", b"\xff\xfe".decode("utf-8", "surrogateescape")],
        "invalid UTF-8 system": gen + ["--chat", "--system", b"\xc3".decode("utf-8", "surrogateescape")],
        "prompt longer than the context": ["generate", "--model", str(good), "--prompt", "word " * 20000],
        "broken template": ["generate", "--model", str(tmp / "template.slm"), "--prompt", "Hi", "--chat"],
        "hostile template": ["generate", "--model", str(tmp / "hostile.slm"), "--prompt", "Hi", "--chat"],
        "missing model": ["generate", "--model", str(tmp / "missing.slm"), "--prompt", "Hi"],
        "model is a directory": ["generate", "--model", str(tmp), "--prompt", "Hi"],
        "junk model": ["generate", "--model", str(tmp / "junk.slm"), "--prompt", "Hi"],
        "validate a directory": ["validate", str(tmp)],
        "inspect a truncated file": ["inspect", str(tmp / "truncated.slm")],
        "convert a missing file": ["convert", str(tmp / "missing.gguf"), "-o", str(tmp / "out.slm")],
        "convert junk": ["convert", str(tmp / "junk.slm"), "-o", str(tmp / "out.slm")],
    }
    rows, counts = [], {"cases": 0, "traceback": 0, "exit_0": 0, "multi_line": 0}
    env = {**os.environ, "PYTHONPATH": str(PY)}
    for name, args in cases.items():
        done = subprocess.run([sys.executable, "-m", "webslm.cli", *args], capture_output=True, env=env, timeout=120,
                              preexec_fn=limited)
        err = done.stderr.decode("utf-8", "replace").strip()
        row = {"case": name, "exit": done.returncode, "stderr": err.splitlines()[-1:] if err else [],
               "traceback": "Traceback" in err, "lines": len(err.splitlines())}
        rows.append(row)
        counts["cases"] += 1
        counts["traceback"] += row["traceback"]
        counts["exit_0"] += done.returncode == 0
        counts["multi_line"] += row["lines"] > 1
    return {"counts": counts, "rows": rows}


# -- worker ----------------------------------------------------------------------------------------

def probe_worker(base: bytes) -> dict:
    import asyncio

    from webslm import worker_api
    from webslm.worker.requests import RequestError

    class Chunk:
        def __init__(self, data):
            self.data = data

        def to_memoryview(self):
            return memoryview(self.data)

    loader = worker_api.ModelLoader()
    loader.feed(Chunk(base))
    loader.finish()
    host = worker_api.engine_host(loader, lambda _event: None)
    hi = [{"role": "user", "content": "Hi"}]
    cases = {
        "stop is a string": {"messages": hi, "settings": {"stop": "abc", "max_tokens": 2}},
        "stop has an empty string": {"messages": hi, "settings": {"stop": [""], "max_tokens": 2}},
        "stop has a number": {"messages": hi, "settings": {"stop": [1], "max_tokens": 2}},
        "stop is null": {"messages": hi, "settings": {"stop": None, "max_tokens": 2}},
        "temperature is a string": {"messages": hi, "settings": {"temperature": "1"}},
        "temperature is true": {"messages": hi, "settings": {"temperature": True}},
        "max_tokens 0": {"messages": hi, "settings": {"max_tokens": 0}},
        "max_tokens 1.5": {"messages": hi, "settings": {"max_tokens": 1.5}},
        "top_k -1": {"messages": hi, "settings": {"top_k": -1}},
        "seed 2**64": {"messages": hi, "settings": {"seed": 2**64}},
        "unknown setting": {"messages": hi, "settings": {"warmth": 1}},
        "lone surrogate content": {"messages": [{"role": "user", "content": "a\ud800"}], "settings": {}},
        "role not allowed": {"messages": [{"role": "tool", "content": "x"}], "settings": {}},
        "prompt longer than the context": {"messages": [{"role": "user", "content": "word " * 20000}], "settings": {}},
        "messages not a list": {"messages": "hi", "settings": {}},
    }
    rows, counts = [], {"cases": 0, "untyped": 0, "coerced": 0}
    for name, request in cases.items():
        try:
            reply = json.loads(asyncio.run(host.generate(json.dumps(request), lambda _delta: None)))
            outcome = f"answered ({reply['finish_reason']})"
            counts["coerced"] += 1
        except RequestError as exc:
            outcome = f"RequestError: {str(exc)[:100]}"
        except Exception as exc:        # noqa: BLE001
            outcome = f"untyped {type(exc).__name__}: {str(exc)[:100]}"
            counts["untyped"] += 1
        counts["cases"] += 1
        rows.append({"case": name, "outcome": outcome})
    asyncio.run(host.release())
    return {"counts": counts, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_600)
    ap.add_argument("--sections", default="files,templates,prompts,cli,worker")
    ap.add_argument("--label", default="", help="a name for this run (e.g. before, after)")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench/results/probe_hostile.json")
    args = ap.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    import webslm
    record = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "label": args.label,
              "machine": platform.platform(), "python": platform.python_version(), "webslm": webslm.__file__}
    if args.out.is_file():                 # a rerun of some sections keeps the others
        kept = json.loads(args.out.read_text())
        if kept.get("label") == args.label:
            record = {**kept, **record}
    base = fixture_bytes()
    sections = args.sections.split(",")
    if "files" in sections:
        record["files"] = probe_files(args.cases)
        print("files:", json.dumps(record["files"]["counts"]), flush=True)
        save(record, args.out)
        for row in record["files"]["claims"]:
            print("  ", json.dumps(row), flush=True)
    if "templates" in sections:
        record["templates"] = probe_templates()
        print("templates:", json.dumps(record["templates"]["counts"]), flush=True)
        save(record, args.out)
    if "prompts" in sections:
        record["prompts"] = probe_prompts()
        print("prompts:", json.dumps(record["prompts"]), flush=True)
        save(record, args.out)
    if "cli" in sections:
        record["cli"] = probe_cli(base)
        print("cli:", json.dumps(record["cli"]["counts"]), flush=True)
        save(record, args.out)
    if "worker" in sections:
        record["worker"] = probe_worker(base)
        print("worker:", json.dumps(record["worker"]["counts"]), flush=True)
    save(record, args.out)
    print(f"wrote {args.out}")
    return 0


def save(record: dict, out: pathlib.Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
