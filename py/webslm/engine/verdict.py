"""The engine choice remembered across visits: "on this adapter, the GPU was slower".

choice.py times the admitted GPU against the CPU path once per load. On a software adapter
(Chromium's SwiftShader) the GPU loses by 50-90x and the CPU path answers, which is right,
but only after the whole admission has been paid (feature checks, upload, compilation,
self-tests: minutes on SwiftShader on a 2-core machine, 13-42 s on lavapipe), on every visit.
So the worker keeps the verdict: when a measured choice sends the engine to the CPU path, a
small record goes to the browser's Cache Storage (worker/verdict-store.mjs), and a later load
in the default mode, on the same adapter, browser, model and shader bundle, skips admission
and goes to the CPU path at once, saying why (Choice.sentence, code "gpu-slower-remembered").

    key     sha256 of: the adapter's vendor, architecture, description, fallback flag, feature
            level and features; the browser's name and major version (from the user agent);
            the model's artifact sha256; the shader bundle hash. Whatever could change the
            verdict changes the key, and a record under another key is never looked at.
    record  {"backend": "cpu", "gpu_step_ms", "cpu_step_ms" (two significant digits),
            "gpu_step_finished", "fallback_adapter", "day" (UTC, YYYY-MM-DD)}
    store   a JSON object, key -> record: at most MAX_RECORDS (the oldest go first), at most
            MAX_TEXT_CHARS characters of text

Who changes it (engine_host.EngineHost.admit): a measured choice that keeps the CPU writes its
record; one that keeps the GPU removes it; "measure again" (admit's "remeasure") forgets it
whatever happens next. A forced GPU (untimed, ?gpu=force) and a failed admission leave it as
it was: they measured nothing. A record older than MAX_AGE_DAYS is not used: a driver or an
operating system update keeps the browser's version and may change the answer.

The text is read back from browser storage, so it is untrusted: parse() keeps only records
of exactly this shape under well-formed keys, and anything else (not JSON, too long, another
shape) counts as no record. A store that cannot be read costs a measurement, never an error.

Natively nothing is kept: the command line never chooses by measurement (Engine's
gpu_choice is None there: --backend native is the user's explicit choice).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import math
import re

from .choice import Choice

CODE = "gpu-slower-remembered"   # cpu_reason's code when a kept verdict decided
MAX_RECORDS = 64                 # a store of more records loses its oldest
MAX_TEXT_CHARS = 64 << 10        # a store text longer than this is not parsed (about 200 characters a record)
MAX_AGE_DAYS = 90                # an older verdict is measured afresh
MAX_STEP_MS = 1e7                # a step time beyond this (almost three hours) is not a measurement

_KEY = re.compile(r"[0-9a-f]{64}")
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_BROWSER = re.compile(r"\b(Firefox|HeadlessChrome|Chromium|Chrome|Version)/(\d{1,4})\b")
_FIELDS = {"backend", "gpu_step_ms", "cpu_step_ms", "gpu_step_finished", "fallback_adapter", "day"}


def browser_major(user_agent: str | None) -> str:
    """"Chrome/140", "Firefox/153", "Version/17" (Safari): the browser and its major version,
    the first such token of the user agent; "other" without one. A minor update keeps the key."""
    match = _BROWSER.search(user_agent or "")
    return f"{match[1]}/{match[2]}" if match else "other"


def record_key(adapter, user_agent: str | None, artifact_sha256: str, bundle_hash: str) -> str:
    """The store's key for an adapter (webgpu.interface.AdapterSummary), a browser (its user
    agent), a model (its artifact sha256) and a shader bundle: 64 hex digits."""
    parts = ["webslm-verdict-v1", adapter.vendor, adapter.architecture, adapter.description,
             bool(adapter.is_fallback), adapter.feature_level, sorted(adapter.features),
             browser_major(user_agent), artifact_sha256, bundle_hash]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def parse(text: object) -> dict[str, dict]:
    """The well-formed records of a store's text, by key; {} for anything that is not a store."""
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        return {}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {key: record for key, record in data.items() if _KEY.fullmatch(key) and _well_formed(record)}


def _well_formed(record: object) -> bool:
    if not isinstance(record, dict) or set(record) != _FIELDS or record["backend"] != "cpu":
        return False
    steps_ok = all(type(record[f]) in (int, float) and math.isfinite(record[f]) and 0 < record[f] <= MAX_STEP_MS
                   for f in ("gpu_step_ms", "cpu_step_ms"))
    flags_ok = type(record["gpu_step_finished"]) is bool and type(record["fallback_adapter"]) is bool
    return steps_ok and flags_ok and _day(record["day"]) is not None


def _day(text: object) -> datetime.date | None:
    if not isinstance(text, str) or not _DAY.fullmatch(text):
        return None
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        return None


def remembered(text: object, key: str | None, now: str | None = None) -> Choice | None:
    """The kept verdict for `key` as a Choice (backend "cpu", the step times kept, nothing
    timed now), or None: no such record, or one from the future or older than MAX_AGE_DAYS."""
    record = parse(text).get(key) if key else None
    if record is None:
        return None
    age = (_day(now or today()) - _day(record["day"])).days
    if not 0 <= age <= MAX_AGE_DAYS:
        return None
    return Choice("cpu", record["gpu_step_ms"] / 1000, record["cpu_step_ms"] / 1000, gpu_steps_timed=0,
                  gpu_step_finished=record["gpu_step_finished"], fallback_adapter=record["fallback_adapter"],
                  skipped=f"kept from {record['day']}: GPU admission not run, nothing timed",
                  remembered_on=record["day"])


def updated(text: object, key: str, choice: Choice | None, forget: bool = False,
            now: str | None = None) -> str | None:
    """The store's text after a load: a measured `choice` (its GPU step timed, or bounded from
    below by admission's step-floor stage) replaces the record for `key` with its own when it kept
    the CPU, and removes it when it kept the GPU; forget removes it whatever the choice. None
    when the store is left as it was."""
    records = parse(text)
    before = dict(records)
    if choice is not None and choice.gpu_step_s is not None and choice.remembered_on is None:
        records.pop(key, None)
        if choice.backend == "cpu":
            records[key] = {"backend": "cpu", "gpu_step_ms": _coarse(choice.gpu_step_s),
                            "cpu_step_ms": _coarse(choice.cpu_step_s), "gpu_step_finished": choice.gpu_step_finished,
                            "fallback_adapter": choice.fallback_adapter, "day": now or today()}
    elif forget:
        records.pop(key, None)
    if records == before:
        return None
    newest = sorted(records.items(), key=lambda item: item[1]["day"], reverse=True)[:MAX_RECORDS]
    return json.dumps(dict(sorted(newest)), sort_keys=True)


def _coarse(seconds: float) -> float:
    """Milliseconds to two significant digits: enough to say "60x slower", not a fingerprint."""
    return float(f"{1000 * seconds:.2g}")
