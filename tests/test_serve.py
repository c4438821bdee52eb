"""Tests for serve.py: the URL map, MIME types, path-traversal refusal, methods, --build.

A real ThreadingHTTPServer runs on an ephemeral port over a fake repository in tmp_path.
"""
import http.client
import importlib.util
import os
import threading
from pathlib import Path

import pytest

SERVE_PY = Path(__file__).resolve().parent.parent / "serve.py"
_spec = importlib.util.spec_from_file_location("webslm_serve", SERVE_PY)
serve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve)

SECRET = b"TOP-SECRET-CONTENT"
FILES = {  # repository path -> (URL, expected Content-Type)
    "web/index.html": ("/", "text/html; charset=utf-8"),
    "web/app.js": ("/app.js", "text/javascript; charset=utf-8"),
    "web/style.css": ("/style.css", "text/css; charset=utf-8"),
    "web/sub/index.html": ("/sub/", "text/html; charset=utf-8"),
    "worker/worker.mjs": ("/worker/worker.mjs", "text/javascript; charset=utf-8"),
    "worker/index.html": ("/worker/", "text/html; charset=utf-8"),
    ".assets/site/manifest.json": ("/assets/manifest.json", "application/json"),
    ".assets/site/pyodide/pyodide.asm.wasm": ("/assets/pyodide/pyodide.asm.wasm", "application/wasm"),
    ".assets/site/pyodide/python_stdlib.zip": ("/assets/pyodide/python_stdlib.zip", "application/zip"),
    ".assets/site/wheels/webslm-0.1.0-py3-none-any.whl":
        ("/assets/wheels/webslm-0.1.0-py3-none-any.whl", "application/octet-stream"),
    ".assets/site/models/tiny.slm": ("/assets/models/tiny.slm", "application/octet-stream"),
    ".assets/site/bundle.tgz": ("/assets/bundle.tgz", "application/gzip"),
}


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    for rel in FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(f"content of {rel}".encode())
    (tmp_path / "secret.txt").write_bytes(SECRET)           # outside the repository
    (root / "secret.txt").write_bytes(SECRET)               # inside it, but not mapped
    (root / ".assets" / "cache").mkdir()
    (root / ".assets" / "cache" / "secret.txt").write_bytes(SECRET)
    os.symlink(tmp_path / "secret.txt", root / "web" / "escape.txt")  # symlinks out of web/
    os.symlink(tmp_path, root / "web" / "escdir")
    os.symlink(root / "web" / "app.js", root / "worker" / "linked.js")  # out of worker/ too
    os.symlink("app.js", root / "web" / "alias.js")                     # stays inside: fine
    return root


@pytest.fixture
def server(repo):
    httpd = serve.make_server(serve.url_map(repo), "127.0.0.1", 0, quiet=True)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def request(httpd, method, path):
    conn = http.client.HTTPConnection(*httpd.server_address[:2], timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("rel", FILES)
def test_get_serves_the_mapped_file_with_its_mime_type(server, repo, rel):
    url, mime = FILES[rel]
    status, headers, body = request(server, "GET", url)
    assert status == 200
    assert headers["Content-Type"] == mime
    assert body == (repo / rel).read_bytes()
    assert headers["Cache-Control"] == "no-cache"


def test_head_sends_headers_only(server, repo):
    status, headers, body = request(server, "HEAD", "/assets/pyodide/pyodide.asm.wasm")
    assert (status, body) == (200, b"")
    assert headers["Content-Type"] == "application/wasm"
    size = (repo / ".assets/site/pyodide/pyodide.asm.wasm").stat().st_size
    assert int(headers["Content-Length"]) == size


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_other_methods_are_refused(server, method):
    status, headers, _ = request(server, method, "/")
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"


def test_a_symlink_inside_the_mapped_dir_is_served(server, repo):
    status, _, body = request(server, "GET", "/alias.js")
    assert (status, body) == (200, (repo / "web/app.js").read_bytes())


def test_directory_without_slash_redirects(server):
    for path in ("/worker", "/sub"):
        status, headers, _ = request(server, "GET", path)
        assert status == 301 and headers["Location"] == path + "/"


@pytest.mark.parametrize("path", [
    "/../secret.txt",
    "/%2e%2e/secret.txt",
    "/%2E%2E/secret.txt",
    "/..%2fsecret.txt",
    "/worker/../secret.txt",
    "/worker/../../secret.txt",
    "/worker/%2e%2e/%2e%2e/secret.txt",
    "/assets/../cache/secret.txt",
    "/assets/%2e%2e/cache/secret.txt",
    "//etc/passwd",
    "/%2fetc%2fpasswd",
    "/%2F%2E%2E/secret.txt",
    "/./app.js",
    "/escape.txt",
    "/escdir/secret.txt",
    "/worker/linked.js",
    "/..%5csecret.txt",
    "/x%00.html",
    "/%ff",
    "http://127.0.0.1/index.html",
    "/nonexistent.js",
])
def test_traversal_and_bad_paths_are_refused(server, path):
    status, _, body = request(server, "GET", path)
    assert status in (400, 404)
    assert SECRET not in body and b"root:" not in body


def test_resolve_never_leaves_the_mapped_dirs(repo):
    routes = serve.url_map(repo)
    with pytest.raises(serve.BadPath):
        serve.resolve("/a\0b", routes)
    for bad in ("relative/path", "/x%00.html", "/..%5csecret.txt", "/a%5C..%5Cb"):
        with pytest.raises(serve.BadPath):
            serve.resolve(bad, routes)
    assert serve.resolve("/app.js", routes) == (repo / "web/app.js").resolve()
    assert serve.resolve("/worker/../secret.txt", routes) is None
    assert serve.resolve("/escape.txt", routes) is None


# ---------------------------------------------------------------- --build

def tree(path):
    return {p.relative_to(path).as_posix(): p.read_bytes()
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_build_writes_exactly_the_map(server, repo, tmp_path):
    dest = tmp_path / "out"
    assert serve.main(["--root", str(repo), "--build", str(dest)]) == 0
    built = tree(dest)
    assert built.pop(serve.BUILD_MARKER)
    assert set(built) == {url.lstrip("/") or "index.html" for url, _ in FILES.values()} - {
        "sub/", "worker/"} | {"sub/index.html", "worker/index.html", "alias.js"}
    for rel, data in built.items():  # every built file is what the server serves at that URL
        status, _, body = request(server, "GET", "/" + rel)
        assert (status, body) == (200, data), rel
    assert SECRET not in b"".join(built.values())
    # A second build replaces the first (the marker allows it); the result is the same.
    serve.build_site(repo, dest)
    assert tree(dest) == {**built, serve.BUILD_MARKER: (dest / serve.BUILD_MARKER).read_bytes()}


def test_built_site_serves_like_the_tree(server, repo, tmp_path):
    dest = tmp_path / "out"
    serve.build_site(repo, dest)
    site = serve.make_server(serve.url_map(repo, site=dest), "127.0.0.1", 0, quiet=True)
    threading.Thread(target=site.serve_forever, args=(0.01,), daemon=True).start()
    try:
        for url, mime in FILES.values():
            s1, h1, b1 = request(site, "GET", url)
            s2, h2, b2 = request(server, "GET", url)
            assert (s1, h1["Content-Type"], b1) == (s2, h2["Content-Type"], b2) == (200, mime, b2)
    finally:
        site.shutdown()
        site.server_close()


def test_build_is_refused_without_the_manifest(repo, tmp_path):
    (repo / ".assets/site/manifest.json").unlink()
    with pytest.raises(SystemExit, match="run the set-up first"):
        serve.build_site(repo, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_build_refuses_to_overwrite_a_foreign_directory(repo, tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("years of work")
    with pytest.raises(SystemExit, match="not a webslm site"):
        serve.build_site(repo, tmp_path / "precious")
    assert (tmp_path / "precious" / "thesis.tex").read_text() == "years of work"
    with pytest.raises(SystemExit, match="inside a directory that the site serves"):
        serve.build_site(repo, repo / "web" / "dist")


# ---------------------------------------------------------------- what a hostile client or user can do

def test_a_long_segment_is_404_and_a_long_path_414(server):
    for length in (256, 300, 5000):
        status, _, _ = request(server, "GET", "/" + "a" * length)          # was: connection dropped
        assert status == (404 if length < serve.MAX_PATH_CHARS else 414), length
    status, _, _ = request(server, "GET", "/worker/" + "%C3%A9" * 200 + ".js")   # 400 bytes as a file name
    assert status == 404


@pytest.mark.parametrize("path", ["/", "/app.js", "/nonexistent.js", "/worker", "/%ff"])
def test_every_response_carries_the_security_headers_and_no_python_version(server, path):
    status, headers, _ = request(server, "GET", path)
    for name, value in serve.SECURITY_HEADERS.items():
        assert headers[name] == value, (path, status, name)
    assert "Python" not in headers["Server"] and "BaseHTTP" not in headers["Server"]
    assert "'unsafe-inline'" not in serve.CONTENT_SECURITY_POLICY and "'unsafe-eval'" not in serve.CONTENT_SECURITY_POLICY


def test_the_page_needs_no_inline_script_or_style():
    """The CSP allows scripts and styles from files only: the page must not inline any."""
    import re
    html = (SERVE_PY.parent / "web" / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "an inline <script>"
    assert "<style" not in html and not re.search(r"\sstyle=", html) and not re.search(r"\son[a-z]+=", html)


def test_an_idle_connection_is_closed(repo, monkeypatch):
    import socket
    monkeypatch.setattr(serve.Handler, "timeout", 0.3)
    httpd = serve.make_server(serve.url_map(repo), "127.0.0.1", 0, quiet=True)
    threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True).start()
    try:
        with socket.create_connection(httpd.server_address[:2], timeout=20) as idle:
            assert idle.recv(1) == b""       # the server hung up: the thread is free again
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert serve.Server.request_queue_size == serve.BACKLOG >= 128


def test_rebuilding_keeps_files_the_user_added(repo, tmp_path):
    dest = tmp_path / "out"
    serve.build_site(repo, dest)
    (dest / "notes.txt").write_text("mine")                  # the user's own file, next to the site
    with pytest.raises(SystemExit, match="did not write .*notes.txt"):
        serve.build_site(repo, dest)
    assert (dest / "notes.txt").read_text() == "mine" and (dest / "index.html").is_file()
    (dest / "notes.txt").unlink()
    (dest / "app.js").unlink()                                # a built file gone: fine, rebuilt
    serve.build_site(repo, dest)
    assert (dest / "app.js").is_file()


def test_a_build_marker_without_its_file_list_is_not_trusted(repo, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / serve.BUILD_MARKER).write_text("built by serve.py --build; safe to replace\n")   # an old marker
    (dest / "thesis.tex").write_text("years of work")
    with pytest.raises(SystemExit, match="not a webslm site"):
        serve.build_site(repo, dest)
    assert (dest / "thesis.tex").read_text() == "years of work"


def test_build_into_a_file_or_an_empty_directory(repo, tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(SystemExit, match="is a file, not a directory"):
        serve.build_site(repo, tmp_path / "a-file")
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    serve.build_site(repo, tmp_path / "empty")
    assert (tmp_path / "empty" / "index.html").is_file()


def test_serving_a_missing_site_is_an_error(tmp_path):
    import subprocess
    import sys
    # a process with a limit: the mistake used to start a server that answered 404 forever
    done = subprocess.run([sys.executable, str(SERVE_PY), "--site", str(tmp_path / "nowhere"), "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is not a directory" in done.stderr and "Traceback" not in done.stderr
