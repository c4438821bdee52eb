"""The native path's replay loop (py/webslm/webgpu/replay.c, native_replay.py): a recorded
compute pass encoded by one C call instead of three cffi calls a dispatch.

- Built wherever clang is (set-up runs tools/build_kernels.py), and loaded by the device.
- The C loop makes exactly the Python loop's calls: fed logging callbacks in place of
  wgpu-native's entry points, pipeline set only where it changes, bind group 0, every grid.
- A session's logits through prefill and decode are bit for bit the same with the C loop and
  with the Python loop (one GPU work, two encoders), and the device really used each.
- WEBSLM_NATIVE_REPLAY=off leaves the Python loop.
"""
from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest

from webslm.webgpu import native_replay

# Only without clang (the first test fails a set-up that had clang and did not build it).
NOT_BUILT = "replay.c is not built: no clang here (tools/build_kernels.py builds it; apt: clang lld)"


def test_the_replay_loop_is_built_where_clang_is():
    if shutil.which("clang") is None and shutil.which("clang-14") is None:
        pytest.skip("no clang: the native path encodes in Python (apt: clang)")
    assert native_replay.LIBRARY.is_file(), "tools/build_kernels.py (run by set-up) did not build it"


def _logging_replay():
    """A Replay whose three entry points are Python callbacks that log each call."""
    if not native_replay.LIBRARY.is_file():
        pytest.skip(NOT_BUILT)
    calls = []
    set_pipeline = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
        lambda p, pipeline: calls.append(("pipeline", p, pipeline)))
    set_group = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_void_p)(
        lambda p, index, group, count, offsets: calls.append(("group", p, index, group, count, offsets)))
    dispatch = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32)(
        lambda p, x, y, z: calls.append(("dispatch", p, x, y, z)))
    from wgpu.backends.wgpu_native._ffi import ffi, lib
    replay = native_replay.Replay(native_replay.LIBRARY, ffi, lib)
    replay._entry_points = [ctypes.cast(f, ctypes.c_void_p).value for f in (set_pipeline, set_group, dispatch)]
    return replay, calls, (set_pipeline, set_group, dispatch)


def test_the_c_loop_makes_the_python_loops_calls():
    replay, calls, _alive = _logging_replay()
    # pipelines A A B A (set three times), large grids and handles, and a one-dispatch list
    rows = [(0x1000, 0x2000, 1, 1, 1), (0x1000, 0x2008, 65535, 7, 1), (0x3000, 0x2010, 3, 65535, 2),
            (0x1000, 0x2018, 2**31, 1, 65535)]
    pass_handle = 0xABCD00
    replay.encode(pass_handle, replay.commands(rows))
    want, previous = [], None
    for pipeline, group, x, y, z in rows:            # native.py's Python loop, written out
        if pipeline != previous:
            want.append(("pipeline", pass_handle, pipeline))
            previous = pipeline
        want += [("group", pass_handle, 0, group, 0, None), ("dispatch", pass_handle, x, y, z)]
    assert calls == want
    calls.clear()
    replay.encode(pass_handle, replay.commands(rows[1:2]))
    assert [c[0] for c in calls] == ["pipeline", "group", "dispatch"]
    calls.clear()
    replay.encode(pass_handle, replay.commands([]))
    assert calls == []


def _logits(gpu, model, replay_on: bool):
    from webslm.admission.admit import AdmissionPolicy, admit
    from webslm.backends.gpu import GpuBackend
    from webslm.backends.scores import Want

    async def go():
        session = await admit(gpu, model, AdmissionPolicy(context=64))
        device = session.device.inner
        if not replay_on:
            device.replay = None                      # before the backend records its steps
        backend = await GpuBackend.build(session, model)
        try:
            rows = [(await backend.prefill([1, 5, 9, 200, 7, 3], Want("full"))).logits]
            for _ in range(6):
                rows.append((await backend.decode_one(int(np.argmax(rows[-1])), Want("full"))).logits)
            used = {type(r.handle).__name__: r.handle.arrays is not None for r in backend._recordings.values()
                    if r.handle is not None}
            return rows, used
        finally:
            backend.release()
    return go()


def test_a_session_decodes_the_same_bits_with_the_c_loop_and_the_python_loop(native_gpu, stacked_slm_path, run):
    import webslm
    if not native_replay.LIBRARY.is_file():
        pytest.skip(NOT_BUILT)
    model = webslm.open_model(stacked_slm_path)
    with_c, used_c = run(_logits(native_gpu, model, True))
    with_python, used_python = run(_logits(native_gpu, model, False))
    assert used_c == {"Commands": True} and used_python == {"Commands": False}
    for got, want in zip(with_c, with_python, strict=True):
        assert np.array_equal(got, want)
    assert len({int(np.argmax(row)) for row in with_c}) > 1 or np.ptp(with_c[0]) > 0   # not a constant


def test_the_switch_leaves_the_python_loop(monkeypatch):
    native_replay.load.cache_clear()
    try:
        monkeypatch.setenv("WEBSLM_NATIVE_REPLAY", "off")
        assert native_replay.load() is None
        native_replay.load.cache_clear()
        monkeypatch.setenv("WEBSLM_NATIVE_REPLAY", "")
        monkeypatch.setenv("WEBSLM_NATIVE_REPLAY_LIB", "/nonexistent/libwebslm_replay.so")
        assert native_replay.load() is None
    finally:
        native_replay.load.cache_clear()
