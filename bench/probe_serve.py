"""Issue 18's probes of serve.py, rerunnable: what a client or a user can make it do.

    .venv/bin/python bench/probe_serve.py [--tree DIR] [--idle 200] [--burst 400] [--out bench/results/probe_serve.json]

Runs DIR/serve.py (default: this tree; give an older checkout for its "before") as its own
process over this tree's files and records: the answer to a 300-character path segment and a
5000-character path (a dropped connection is a failure), the server's threads after --idle
connections sat idle past its timeout (40 s), how many of --burst concurrent GETs failed,
the security headers and the Server banner, tracebacks in the server's stderr, and three
uses of the command line: --build over a previous build holding a file the user added,
--build into a regular file, --site on a missing folder.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
IDLE_WAIT_S = 40


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(port: int, path: str, timeout: float = 10) -> tuple[int | str, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    except (OSError, http.client.HTTPException) as exc:
        return f"failed: {type(exc).__name__}", {}
    finally:
        conn.close()


def threads_of(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def probe_server(serve_py: pathlib.Path, idle: int, burst: int) -> dict:
    port = free_port()
    log = tempfile.TemporaryFile()
    server = subprocess.Popen([sys.executable, str(serve_py), "--root", str(ROOT), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=log)
    record: dict = {}
    try:
        for _ in range(100):
            if isinstance(get(port, "/", timeout=1)[0], int):
                break
            time.sleep(0.1)
        record["segment_300"] = get(port, "/" + "a" * 300)[0]
        record["path_5000"] = get(port, "/" + "a/" * 2500)[0]
        status, headers = get(port, "/")
        record["headers"] = {k: headers.get(k) for k in ("Server", "Content-Security-Policy", "Referrer-Policy",
                                                          "X-Content-Type-Options")}
        sockets = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(idle)]
        time.sleep(2)
        record["threads_with_idle_connections"] = threads_of(server.pid)
        time.sleep(IDLE_WAIT_S)
        record[f"threads_{IDLE_WAIT_S}s_later"] = threads_of(server.pid)
        for sock in sockets:
            sock.close()
        time.sleep(1)
        with concurrent.futures.ThreadPoolExecutor(burst) as pool:
            outcomes = list(pool.map(lambda _: get(port, "/index.html", timeout=10)[0], range(burst)))
        record["burst"] = {"requests": burst, "failed": sum(not isinstance(o, int) or o != 200 for o in outcomes)}
    finally:
        server.terminate()
        server.wait(10)
        log.seek(0)
        err = log.read().decode("utf-8", "replace")
    record["server_tracebacks"] = err.count("Traceback")
    return record


def probe_command_line(serve_py: pathlib.Path) -> dict:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="probe-serve-"))
    record = {}
    site = tmp / "site"
    first = subprocess.run([sys.executable, str(serve_py), "--root", str(ROOT), "--build", str(site)],
                           capture_output=True, text=True)
    (site / "my-notes.txt").write_text("the user's own file")
    second = subprocess.run([sys.executable, str(serve_py), "--root", str(ROOT), "--build", str(site)],
                            capture_output=True, text=True)
    record["rebuild_with_a_user_file"] = {
        "first_exit": first.returncode, "exit": second.returncode, "user_file_kept": (site / "my-notes.txt").exists(),
        "traceback": "Traceback" in second.stderr, "message": second.stderr.strip().splitlines()[-1:]}
    (tmp / "a-file").write_text("x")
    into_file = subprocess.run([sys.executable, str(serve_py), "--root", str(ROOT), "--build", str(tmp / "a-file")],
                               capture_output=True, text=True)
    record["build_into_a_file"] = {"exit": into_file.returncode, "traceback": "Traceback" in into_file.stderr,
                                   "message": into_file.stderr.strip().splitlines()[-1:]}
    port = free_port()
    missing = subprocess.Popen([sys.executable, str(serve_py), "--site", str(tmp / "missing"), "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    if missing.poll() is None:
        record["site_missing"] = {"exit": None, "serves": get(port, "/")[0]}
        missing.terminate()
        missing.wait(10)
    else:
        record["site_missing"] = {"exit": missing.returncode, "message": missing.stderr.read().strip().splitlines()[-1:]}
    shutil.rmtree(tmp, ignore_errors=True)
    return record


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=pathlib.Path, default=ROOT, help="the checkout whose serve.py runs")
    ap.add_argument("--idle", type=int, default=200)
    ap.add_argument("--burst", type=int, default=400)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "bench/results/probe_serve.json")
    args = ap.parse_args(argv)
    serve_py = args.tree / "serve.py"
    record = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "label": args.label,
              "serve_py": str(serve_py), **probe_server(serve_py, args.idle, args.burst),
              **probe_command_line(serve_py)}
    print(json.dumps(record, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
