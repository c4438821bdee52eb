#!/usr/bin/env python3
"""Make Playwright's WebDriver-BiDi Firefox path work with Firefox ESR 153.

Playwright (verified: Python package 1.65.2, bundled playwright-core 1.65.1) sends the BiDi
command ``emulation.setMediaFeaturesOverride`` whenever a browser context (and page) is created.
Firefox ESR 153 does not implement it and answers "unknown command", so every
``browser.new_context()`` fails with::

    Protocol error (emulation.setMediaFeaturesOverride): unknown command

This script patches the two ``send("emulation.setMediaFeaturesOverride", {...})`` calls in
``playwright/driver/package/lib/coreBundle.js`` of the *installed* playwright package so that
an "unknown command" error is ignored (any other error is still raised).  Colour-scheme
emulation is then simply unavailable on that Firefox, which we do not use.

Idempotent.  Prints one of:
    already patched (N sites)
    patched N sites
    not needed: <reason>
and exits non-zero ("unrecognized layout: ...") if the file does not look as expected.

Usage:  python tools/patch_playwright.py [--check] [--file PATH]
    --check  report only; exit 1 if unpatched sites are present, 0 otherwise.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

COMMAND = "emulation.setMediaFeaturesOverride"
MARKER = "/*webslm:tolerate-unknown-command*/"
CATCH = (
    ".catch((e) => { " + MARKER + " if (!String(e && e.message).includes(\"unknown command\")) throw e; })"
)
# `<receiver>.send("emulation.setMediaFeaturesOverride", {`
SITE_RE = re.compile(r'\.send\("' + re.escape(COMMAND) + r'",\s*\{')
MAX_ARG_CHARS = 800  # the argument object literal is a few lines; anything longer is unexpected


class LayoutError(RuntimeError):
    pass


def find_core_bundle() -> Path:
    try:
        import playwright  # noqa: WPS433 (import only to locate the package)
    except ImportError as exc:  # pragma: no cover
        raise LayoutError(f"playwright is not importable from {sys.executable}: {exc}") from exc
    path = Path(playwright.__file__).resolve().parent / "driver" / "package" / "lib" / "coreBundle.js"
    if not path.is_file():
        raise LayoutError(f"{path} does not exist (playwright layout changed?)")
    return path


def _call_end(text: str, brace_pos: int) -> int:
    """Given the index of the '{' opening the argument object, return the index just past the
    ')' that closes the send(...) call. Raises LayoutError if the shape is not `{...})`."""
    depth = 0
    i = brace_pos
    limit = min(len(text), brace_pos + MAX_ARG_CHARS)
    in_str: str | None = None
    while i < limit:
        c = text[i]
        if in_str:
            if c == "\\":
                i += 2
                continue
            if c == in_str:
                in_str = None
        elif c in "\"'`":
            in_str = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                j = i + 1
                while j < len(text) and text[j] in " \t\r\n":
                    j += 1
                if j >= len(text) or text[j] != ")":
                    raise LayoutError(f"argument object at offset {brace_pos} is not followed by ')'")
                return j + 1
        i += 1
    raise LayoutError(f"could not find the end of the send() call at offset {brace_pos}")


def analyse(text: str) -> tuple[list[int], int]:
    """Return (insertion offsets of unpatched sites, number of already patched sites)."""
    unpatched: list[int] = []
    patched = 0
    for m in SITE_RE.finditer(text):
        end = _call_end(text, m.end() - 1)
        tail = text[end:end + len(CATCH) + 10]
        if tail.startswith(CATCH):
            patched += 1
        elif tail.lstrip().startswith(";"):
            unpatched.append(end)
        else:
            raise LayoutError(
                f"send({COMMAND!r}) call at offset {m.start()} is followed by {tail[:40]!r}, "
                "expected ';' (unpatched) or our .catch (patched)")
    return unpatched, patched


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="report only, do not modify")
    ap.add_argument("--file", type=Path, help="coreBundle.js to patch (default: the installed one)")
    args = ap.parse_args(argv)
    try:
        path = args.file or find_core_bundle()
        text = path.read_text(encoding="utf-8")
        n_mentions = text.count(f'"{COMMAND}"')
        unpatched, patched = analyse(text)
        if n_mentions != len(unpatched) + patched:
            raise LayoutError(
                f"{COMMAND!r} appears {n_mentions} times but only {len(unpatched) + patched} "
                "send(...) call sites were recognised")
    except LayoutError as exc:
        print(f"unrecognized layout: {exc}", file=sys.stderr)
        return 2
    if not unpatched and patched:
        print(f"already patched ({patched} sites) in {path}")
        return 0
    if not unpatched:
        print(f"not needed: {path} never sends {COMMAND}")
        return 0
    if args.check:
        print(f"unpatched: {len(unpatched)} sites in {path}")
        return 1
    for pos in sorted(unpatched, reverse=True):
        text = text[:pos] + CATCH + text[pos:]
    # verify before writing
    again_unpatched, again_patched = analyse(text)
    if again_unpatched or again_patched != len(unpatched) + patched:
        print("unrecognized layout: post-patch verification failed", file=sys.stderr)
        return 2
    tmp = path.with_name(path.name + ".webslm-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    print(f"patched {len(unpatched)} sites in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
