"""The browser rows' processes (tests_browser/drivers.py): each row's process tree, found through
/proc, killed whole when a browser or its driver will not close in time, so that no test run
leaves a browser behind. Only ever processes the drivers started; and the X server the WebKit row starts when there is no display."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

CLOSE_GRACE_S = 15.0             # a row's close() may take this long before its processes are killed

def children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read().decode("latin-1")
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants(root: int) -> list[int]:
    kids = children_map()
    out: list[int] = []
    stack = list(kids.get(root, []))
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(kids.get(pid, []))
    return out


def start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("latin-1")
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def snapshot(roots: list[int]) -> list[tuple[int, int | None]]:
    """(pid, start time) of the given processes and all their current descendants."""
    pids: list[int] = []
    for root in roots:
        pids.extend(descendants(root))
        pids.append(root)
    return [(pid, start_time(pid)) for pid in dict.fromkeys(pids)]


def killsnapshot(snap: list[tuple[int, int | None]]) -> None:
    """SIGKILL the processes of a snapshot that still exist (same pid and start time), plus
    any descendants they have now.  Only ever processes this module started."""
    live = [pid for pid, st in snap if st is not None and start_time(pid) == st]
    for pid in snapshot(live):
        try:
            os.kill(pid[0], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(pids: list[int]) -> None:
    """SIGKILL the given pids and all their current descendants (only processes we started)."""
    killsnapshot(snapshot(pids))


def own_children() -> set[int]:
    return set(children_map().get(os.getpid(), []))


def run_with_watchdog(steps: list, pids: list[int], grace_s: float = CLOSE_GRACE_S) -> None:
    """Run shutdown callables in order; if they take longer than ``grace_s`` in total, kill the
    process trees in ``pids`` (which unblocks any call waiting on them).  Afterwards kill every
    process of those trees (as they were before shutdown) that is still alive: e.g. a WebKit
    web process whose page hangs outlives MiniBrowser, orphaned."""
    snap = snapshot(pids)
    timer = threading.Timer(grace_s, killsnapshot, args=(snap,))
    timer.daemon = True
    timer.start()
    try:
        for step in steps:
            try:
                step()
            except Exception:  # noqa: BLE001 - best-effort shutdown
                pass
    finally:
        timer.cancel()
        killsnapshot(snap)
        for pid in pids:  # reap our direct children so they do not linger as zombies
            try:
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass


def start_xvfb(binary: str) -> tuple[subprocess.Popen, str]:
    """Start Xvfb on a free display chosen by Xvfb itself (-displayfd); return (proc, ":N")."""
    rfd, wfd = os.pipe()
    try:
        proc = subprocess.Popen(
            [binary, "-displayfd", str(wfd), "-screen", "0", "1280x1024x24", "-nolisten", "tcp"],
            pass_fds=(wfd,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    finally:
        os.close(wfd)
    try:
        buf = b""
        deadline = time.monotonic() + 20
        os.set_blocking(rfd, False)
        while not buf.endswith(b"\n"):
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                proc.wait(5)
                raise RuntimeError(f"Xvfb did not report a display (rc={proc.poll()})")
            try:
                chunk = os.read(rfd, 64)
            except BlockingIOError:
                time.sleep(0.05)
                continue
            if not chunk:
                time.sleep(0.05)
                continue
            buf += chunk
    finally:
        os.close(rfd)
    return proc, ":" + buf.decode().strip()
