"""Serve webslm locally, or build it into a self-contained static site (stdlib only).

    python serve.py [--host 127.0.0.1] [--port 8000] [--root REPO]   serve the working tree
    python serve.py --site DIR                                        serve a built site
    python serve.py --build DIR                                       write a static site to DIR

One URL map serves both purposes (ROUTES): `/` -> web/ (`/` is web/index.html),
`/worker/` -> worker/, `/assets/` -> .assets/site/ (made by tools/assets.py). The built site
puts the same files at the same paths, so `python -m http.server -d DIR` serves it identically.

Safety: only GET and HEAD; request paths are decoded once and then taken apart into segments;
empty, `.` and `..` segments, backslashes, NUL and anything that resolves (through symlinks)
outside its mapped directory get 400/404; a path over MAX_PATH_CHARS gets 414 and a segment
longer than a file name can be 404. Directories are never listed; a directory serves its
index.html. `.whl` is served as application/octet-stream, which is what `python -m http.server`
sends too (Pyodide fetches wheels as bytes; the type does not matter to it). Every response
carries SECURITY_HEADERS (a Content-Security-Policy the page runs under, no Referer leaves it)
and names no Python version. A connection idle for TIMEOUT_S is closed; the listen backlog
is BACKLOG, so a burst of page loads waits rather than fails.

--build writes into a new or empty directory, or one it built before (its BUILD_MARKER lists
the files it wrote): it refuses a directory holding anything else, and says what.
"""
from __future__ import annotations

import argparse
import mimetypes
import os
import shutil
import sys
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

ROUTES = (("/worker/", "worker"), ("/assets/", ".assets/site"), ("/", "web"))
MANIFEST = Path(".assets/site/manifest.json")
BUILD_MARKER = ".webslm-site"
MARKER_HEADER = "built by serve.py --build; safe to replace. The files it wrote:"
MAX_PATH_CHARS = 4096         # longer request paths: 414
MAX_SEGMENT_BYTES = 255       # no file name is longer (NAME_MAX): such a path is 404
TIMEOUT_S = 30                # an idle connection is closed after this long
BACKLOG = 128                 # pending connections the kernel holds while threads start

# The page runs Python in WebAssembly ('wasm-unsafe-eval'), workers and its service worker from
# this origin, and fetches models from wherever the user points it (connect-src https: http:).
CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'", "script-src 'self' 'wasm-unsafe-eval'", "style-src 'self'",
    "img-src 'self' data: blob:", "connect-src 'self' https: http:", "worker-src 'self'",
    "object-src 'none'", "base-uri 'none'", "form-action 'none'", "frame-ancestors 'none'"])
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
MIME_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".map": "application/json",
    ".wasm": "application/wasm",
    ".wgsl": "text/plain; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".ico": "image/x-icon",
    ".zip": "application/zip",
    ".whl": "application/octet-stream",
    ".slm": "application/octet-stream",
    ".tgz": "application/gzip",
    ".gz": "application/gzip",
}


class BadPath(ValueError):
    """The request path is malformed (400), as opposed to merely not found (404)."""


class PathTooLong(BadPath):
    """The request path is longer than MAX_PATH_CHARS (414)."""


def url_map(root: Path, site: Path | None = None) -> list[tuple[str, Path]]:
    """The (URL prefix, directory) pairs, longest prefix first."""
    if site is not None:
        return [("/", Path(site).resolve())]
    return [(prefix, (Path(root) / rel).resolve()) for prefix, rel in ROUTES]


def content_type(path: Path) -> str:
    ext = path.suffix.lower()
    return MIME_TYPES.get(ext) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def inside(path: Path, base: Path) -> bool:
    """True if `path`, with every symlink resolved, lies inside `base` (already resolved)."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(base)
    except (OSError, ValueError):
        return False


def resolve(raw_path: str, routes) -> Path | None:
    """The file that a request path names, or None (404). Raises BadPath (400), PathTooLong (414)."""
    if len(raw_path) > MAX_PATH_CHARS:
        raise PathTooLong(raw_path[:80])
    if "\0" in raw_path or not raw_path.startswith("/"):
        raise BadPath(raw_path)
    path = unquote(raw_path.split("?", 1)[0].split("#", 1)[0], errors="strict")
    if "\0" in path or "\\" in path:
        raise BadPath(raw_path)
    for prefix, base in routes:
        if path.startswith(prefix):
            rest = path[len(prefix):]
            break
    else:
        return None
    parts = rest.split("/")
    if parts[-1] == "":  # a trailing slash, or the prefix itself: the directory's index
        parts[-1] = "index.html"
    if any(p in ("", ".", "..") or len(os.fsencode(p)) > MAX_SEGMENT_BYTES for p in parts):
        return None
    target = base.joinpath(*parts)
    try:
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file() or not inside(target, base):
            return None
    except OSError:          # ENAMETOOLONG, ELOOP, EACCES...: nothing to serve
        return None
    return target


class Handler(BaseHTTPRequestHandler):
    server_version = "webslm-serve"
    timeout = TIMEOUT_S      # StreamRequestHandler sets it on the socket: idle connections end

    def version_string(self):
        return self.server_version              # not "BaseHTTP/0.6 Python/3.x.y"

    def end_headers(self):
        for name, value in SECURITY_HEADERS.items():
            self.send_header(name, value)
        super().end_headers()

    def do_GET(self):
        self.send_file(body=True)

    def do_HEAD(self):
        self.send_file(body=False)

    def refuse_method(self):
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = refuse_method

    def send_file(self, body: bool):
        try:
            target = resolve(self.path, self.server.routes)
        except PathTooLong:
            return self.send_error(HTTPStatus.REQUEST_URI_TOO_LONG)
        except (BadPath, UnicodeDecodeError):
            return self.send_error(HTTPStatus.BAD_REQUEST)
        path = self.path.split("?", 1)[0]
        is_prefix = any(path + "/" == prefix for prefix, _ in self.server.routes)
        if is_prefix or (target is not None and target.name == "index.html"
                         and not path.endswith(("/", ".html"))):
            # /worker -> /worker/, so that relative URLs inside the page resolve correctly
            self.send_response(HTTPStatus.MOVED_PERMANENTLY)
            self.send_header("Location", path + "/")
            self.send_header("Content-Length", "0")
            return self.end_headers()
        if target is None:
            return self.send_error(HTTPStatus.NOT_FOUND)
        try:
            f = open(target, "rb")
        except OSError:
            return self.send_error(HTTPStatus.NOT_FOUND)
        with f:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", content_type(target))
            self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            if body:
                shutil.copyfileobj(f, self.wfile)

    def log_message(self, fmt, *args):
        if not getattr(self.server, "quiet", False):
            super().log_message(fmt, *args)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = BACKLOG

    def handle_error(self, request, client_address):
        # A browser that stops a download (a cancelled model load, a page reload) resets the
        # connection mid-response; that is normal, not a server error worth a traceback.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


def make_server(routes, host: str = "127.0.0.1", port: int = 8000, quiet: bool = False):
    server = Server((host, port), Handler)
    server.routes, server.quiet = routes, quiet
    return server


# ---------------------------------------------------------------- static build

def site_files(routes) -> dict[str, Path]:
    """Every file the map serves, keyed by its path relative to the site root."""
    files: dict[str, Path] = {}
    for prefix, base in reversed(routes):  # "/" first; the more specific prefixes win
        if not base.is_dir():
            raise SystemExit(f"serve: {base} is missing")
        seen = {os.path.realpath(base)}  # symlinked directories are followed, once each
        for dirpath, dirnames, filenames in os.walk(base, followlinks=True):
            real = {d: os.path.realpath(Path(dirpath, d)) for d in dirnames}
            dirnames[:] = [d for d in dirnames
                           if inside(Path(dirpath, d), base) and real[d] not in seen]
            seen.update(real[d] for d in dirnames)
            for name in filenames:
                src = Path(dirpath, name)
                if not inside(src, base) or not src.is_file():
                    print(f"serve: skipping {src} (outside {base})", file=sys.stderr)
                    continue
                rel = prefix.lstrip("/") + src.relative_to(base).as_posix()
                if rel in files and files[rel] != src:
                    raise SystemExit(f"serve: {rel} comes from both {files[rel]} and {src}")
                files[rel] = src
    return files


def build_site(root: Path, dest: Path) -> dict[str, Path]:
    """Copy everything the map serves into `dest`. Returns the files copied."""
    root, dest = Path(root).resolve(), Path(dest).resolve()
    if not (root / MANIFEST).is_file():
        raise SystemExit(f"serve: {root / MANIFEST} is missing: run the set-up first "
                         "(python tools/assets.py)")
    routes = url_map(root)
    if any(inside(dest, base) for _, base in routes):
        raise SystemExit(f"serve: {dest} lies inside a directory that the site serves")
    ours = previous_build(dest)
    files = site_files(routes)
    for rel in sorted(ours, reverse=True):      # the previous build's files, then its empty folders
        (dest / rel).unlink(missing_ok=True)
        for parent in (dest / rel).parents:
            if parent == dest or any(parent.iterdir()):
                break
            parent.rmdir()
    dest.mkdir(parents=True, exist_ok=True)
    for rel, src in sorted(files.items()):
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)
    (dest / BUILD_MARKER).write_text("\n".join([MARKER_HEADER, *sorted(files)]) + "\n")
    return files


def previous_build(dest: Path) -> set[str]:
    """The files a previous build wrote into `dest` (empty when there is none), after checking
    that `dest` holds nothing else: a user's own files are never replaced or deleted."""
    if not dest.exists():
        return set()
    if not dest.is_dir():
        raise SystemExit(f"serve: {dest} is a file, not a directory; choose a directory for the site")
    found = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if not p.is_dir()} - {BUILD_MARKER}
    if not found and not (dest / BUILD_MARKER).exists():
        return set()                             # an empty directory (perhaps with empty folders)
    marker = dest / BUILD_MARKER
    lines = marker.read_text(errors="replace").splitlines() if marker.is_file() else []
    if not lines or lines[0] != MARKER_HEADER:
        raise SystemExit(f"serve: {dest} is not empty and is not a webslm site serve.py built (no "
                         f"{BUILD_MARKER} listing its files); choose a new or empty directory")
    foreign = sorted(found - set(lines[1:]))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise SystemExit(f"serve: {dest} holds files a previous build did not write ({shown}); move them "
                         f"out, or choose another directory: --build replaces only what it wrote")
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Serve webslm, or build a static site.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent,
                    help="repository root (default: this file's directory)")
    ap.add_argument("--site", type=Path, help="serve this built site instead of the working tree")
    ap.add_argument("--build", type=Path, metavar="DIR", help="write a static site to DIR and exit")
    args = ap.parse_args(argv)
    if args.site is not None and not args.site.is_dir():
        print(f"serve: --site {args.site} is not a directory (build one with --build DIR)", file=sys.stderr)
        return 2
    if args.build:
        files = build_site(args.root, args.build)
        print(f"serve: wrote {len(files)} files to {args.build}; "
              f"try: python -m http.server -d {args.build}")
        return 0
    try:
        server = make_server(url_map(args.root, args.site), args.host, args.port)
    except OSError as e:
        print(f"serve: cannot listen on {args.host}:{args.port} ({e.strerror or e})", file=sys.stderr)
        return 1
    host, port = server.server_address[:2]
    print(f"serve: http://{host}:{port}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
