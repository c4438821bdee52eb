"""The tuning stage's results kept between admissions (tuning.py): keys, and the file the
native engine keeps them in (the browser's worker keeps the same JSON in Cache Storage:
worker/tuning-store.mjs, py/webslm/worker/engine_host.py). A cache is a hint and untrusted:
its text is parsed with size caps, and `tuning.tune` checks every entry it uses (one that is not
a valid choice is measured afresh)."""
from __future__ import annotations

import json
import os
import pathlib
from typing import Mapping


def cache_key(device_identity: str, bundle_hash: str, form: str, int8: bool = True) -> str:
    """The cache's key: a result holds for one adapter (description, vendor, architecture,
    features), one shader bundle, one form, and whether int8 activations were allowed."""
    return f"{device_identity}|{bundle_hash[:16]}|{form}" + ("" if int8 else "|exact")


MAX_CACHE_ENTRIES = 4096       # a cache file past this is started afresh


def cache_path() -> pathlib.Path | None:
    """Where the native engine keeps tuning results: $WEBSLM_TUNING_CACHE (a file; "off": no
    cache), else $XDG_CACHE_HOME/webslm/matvec-tuning.json (~/.cache by default)."""
    chosen = os.environ.get("WEBSLM_TUNING_CACHE")
    if chosen == "off":
        return None
    if chosen:
        return pathlib.Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "webslm" / "matvec-tuning.json"


def read_cache(path: pathlib.Path | None) -> dict[str, dict]:
    """The cache file's entries; {} when it is missing, unreadable or not this shape (a cache
    is a hint: `tune` checks every entry it uses)."""
    if path is None:
        return {}
    try:
        return parse_cache(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


MAX_CACHE_CHARS = 4 << 20      # a stored cache longer than this is not parsed (about 1 KB an entry)


def parse_cache(text: object) -> dict[str, dict]:
    """A cache's entries from its JSON text (a file, or what the worker kept in the browser's
    Cache Storage: untrusted either way); {} when it is not that shape or too long."""
    if not isinstance(text, str) or len(text) > MAX_CACHE_CHARS:
        return {}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or len(data) > MAX_CACHE_ENTRIES:
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, dict)}


def write_cache(path: pathlib.Path | None, entries: Mapping[str, dict]) -> None:
    """Merge new entries into the cache file (replaced atomically); a cache that cannot be
    written costs a re-measurement next time, not an error."""
    if path is None or not entries:
        return
    merged = {**read_cache(path), **entries}
    if len(merged) > MAX_CACHE_ENTRIES:
        merged = dict(entries)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(merged, sort_keys=True), encoding="utf-8")
        partial.replace(path)
    except OSError:
        pass
