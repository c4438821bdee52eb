"""The q|k|v mat-vec with RoPE and the KV append in its epilogue (kernels/matvec_rope_kv.py) on
wgpu-native: its golden family, its host-side refusals, and a check that must fail a wrong row."""
import numpy as np
import pytest

from webslm.kernels import golden, matvec
from webslm.kernels import matvec_rope_kv as mrk
from webslm.kernels.kv_cache import KvLayout, KvShapeError
from webslm.kernels.rope import rope_table
from webslm.kernels.rope_kv import RopeKvPlan, check_rope_kv, prior_cache

FAMILY = mrk.FAMILY


def _results(report):
    return report["families"][FAMILY]["results"]


def test_golden_matvec_rope_kv_full(native_device, run):
    """Exact norm-input encodings (q4 min and offset, q8, f16) and pre-quantized q4 in its three
    byte forms, both conventions and cache types,
    ROWS 4 to 16, head_dim 8 to 128, the first and the last cache row: y's k and v rows equal
    to the plain mat-vec's bit for bit, q and the caches as rope_kv_append's rules allow."""
    report = run(golden.run_all(native_device, "full", families=[FAMILY]))
    assert report["passed"], report["failed"]
    results = _results(report)
    labels = " ".join(r["kernel"] for r in results)
    for form in ("rkv_matvec_norm_q4", "rkv_matvec_norm_q8", "rkv_matvec_norm_f16", "ZERO_MIN=0", "SCALE_F16=0",
                 "ADJACENT=0", "ADJACENT=1", "KV_F16=0", "KV_F16=1", "ROWS=4", "ROWS=16"):
        assert form in labels, form
    if "subgroups" in native_device.features:     # the int8 forms need dot4 (lavapipe has it)
        assert "rkv_matvec_int8_q4_dot4" in labels and "ROW_NORM=0" in labels and "RESIDUAL=0" in labels
    launches = sum("y's k and v rows against the plain mat-vec" in r["case"] for r in results)
    assert launches >= 9
    assert all(r["mismatched"] == 0 for r in results if r["rule"] == "exact")


def test_golden_matvec_rope_kv_quick_is_small(native_device, run):
    report = run(golden.run_all(native_device, "quick", families=[FAMILY]))
    assert report["passed"], report["failed"]
    assert 6 <= len(_results(report)) <= 14


def _plan(device, heads=4, kv=2, e=32, rows_per_group=4, rotary=None, start=3, capacity=8, rows=None, m=1):
    rows = (heads + 2 * kv) * e if rows is None else rows
    weights = matvec.random_weights_fast(np.random.default_rng(0), "q4", rows, 128)
    mv = matvec.plan(device, weights, m, 128, rows, "norm", eps=1e-5, norm_elements=128,
                     rows_per_group=rows_per_group)
    return mrk.plan(device, mv, weights, heads, KvLayout(kv, capacity, e, "f16"), rotary or e, start, capacity,
                    "rotate-half")


def test_the_plan_carries_the_position_and_one_workgroup_a_pair_block(native_device):
    p = _plan(native_device, start=5)
    assert p.kernel.startswith(mrk.PREFIX) and p.overrides["ROWS"] == 4 and p.overrides["KV_F16"] == 1
    assert int(p.params[8]) == 5 and int(p.params[10]) == 32 and int(p.params[14]) == 32 // 4
    assert p.grid[0] * p.grid[1] == (4 + 4) * 32 // 4      # as many workgroups as the plain launch


@pytest.mark.parametrize("rows_per_group", [1, 2])
def test_fewer_than_four_rows_a_block_become_four(native_device, rows_per_group):
    assert _plan(native_device, rows_per_group=rows_per_group).overrides["ROWS"] == 4


@pytest.mark.parametrize("kwargs, problem", [
    ({"rotary": 16}, "whole heads"),
    ({"rows": 4 * 32 + 32}, "are not q|k|v"),
    ({"start": 8}, "outside the cache"),
    ({"m": 2}, "one token"),
])
def test_what_the_kernel_cannot_do_is_refused(native_device, kwargs, problem):
    with pytest.raises(KvShapeError, match=problem):
        _plan(native_device, **kwargs)


def test_a_launch_shape_whose_blocks_split_a_head_falls_back_to_four_rows(native_device):
    assert _plan(native_device, e=8, rows_per_group=16, heads=2, kv=1).overrides["ROWS"] == 4


def test_a_mat_vec_without_a_fused_form_is_refused(native_device):
    """q4k's fused kernel would bind 11 storage buffers: it is not registered, and asking for it
    is a typed refusal, not a KeyError."""
    from webslm.kernels import kquant
    weights = kquant.random_weights(np.random.default_rng(0), "q4k", (2 + 2) * 32, 256)
    mv = matvec.plan(native_device, weights, 1, 256, weights.rows, "norm", eps=1e-5, norm_elements=256)
    with pytest.raises(KvShapeError, match="no fused RoPE form"):
        mrk.plan(native_device, mv, weights, 2, KvLayout(1, 4, 32, "f16"), 32, 0, 4, "rotate-half")


def test_the_checks_fail_a_q_row_rotated_by_the_wrong_position():
    """check_rope_kv (the family's rule) on a y whose q rows were rotated one position late."""
    rng = np.random.default_rng(1)
    heads, kv, e, start = 2, 1, 8, 2
    layout = KvLayout(kv, 4, e, "f32")
    table = rope_table(4, e, 1e4)
    want = rng.standard_normal((heads + 2 * kv) * e).astype(np.float32)
    q, k, v = want[:16].reshape(1, heads, e), want[16:24].reshape(1, kv, e), want[24:].reshape(1, kv, e)
    late = np.concatenate([a * table[start + 1, :, 0] - b * table[start + 1, :, 1] for a, b in
                           [(q[0, h, :4], q[0, h, 4:]) for h in range(heads)]] +
                          [b * table[start + 1, :, 0] + a * table[start + 1, :, 1] for a, b in
                           [(q[0, h, :4], q[0, h, 4:]) for h in range(heads)]])
    y = want.copy()
    y[:16] = np.concatenate([late[0:4], late[8:12], late[4:8], late[12:16]])
    prior = prior_cache(rng, layout, start, 1)
    k_cache, v_cache = prior.copy(), prior.copy()
    plan = RopeKvPlan("", {}, np.zeros(4, np.uint32), (1, 1, 1), 0, 16, 24, want.size)
    results = check_rope_kv("k", "late q", layout, q, k, v, table, start, "rotate-half", prior, prior, want, plan,
                            y, k_cache, v_cache)
    assert not results[0].passed


# -- in a session: the step with the rule against the step without it --------------------------

def _session_logits(gpu, model, fusions, tuning="off"):
    import webslm  # noqa: F401
    from webslm.admission.admit import AdmissionPolicy, admit
    from webslm.backends.gpu import GpuBackend
    from webslm.backends.scores import Want

    async def go():
        session = await admit(gpu, model, AdmissionPolicy(fusions=fusions, tuning=tuning, context=64))
        backend = await GpuBackend.build(session, model)
        try:
            kernels = {name for name, _ in session.kernels}
            rows = [(await backend.prefill([1, 5, 9, 200, 7, 3], Want("full"))).logits]
            for _ in range(4):
                rows.append((await backend.decode_one(int(np.argmax(rows[-1])), Want("full"))).logits)
            return rows, kernels, backend.forward.programs["decode"].dispatches_per_layer()
        finally:
            backend.release()
    return go()


@pytest.mark.parametrize("tuning", ["off", "int8-s"])
def test_the_fused_step_computes_what_the_step_without_it_does(native_gpu, stacked_slm_path, run, tuning):
    """The stacked model's prefill and four decode steps with rope-kv-into-matmul and without:
    5 dispatches a layer against 6, the fused kernel compiled (exact q4, or the pre-quantized q4
    on "xq2s"), and the logits equal within 1e-6 of the largest (the fused y is the plain
    kernel's bit for bit and the rotation the same expressions; on lavapipe they are equal)."""
    import webslm
    from webslm.program.fusion import DEFAULT
    model = webslm.open_model(stacked_slm_path)
    with_rule, kernels, per_layer = run(_session_logits(native_gpu, model, DEFAULT + ("rope-kv-into-matmul",), tuning))
    without, plain_kernels, plain_per_layer = run(_session_logits(native_gpu, model, DEFAULT, tuning))
    assert (per_layer, plain_per_layer) == (5, 6)
    assert any(name.startswith(mrk.PREFIX) for name in kernels) and not any(
        name.startswith(mrk.PREFIX) for name in plain_kernels)
    for got, want in zip(with_rule, without):
        assert float(np.abs(got - want).max()) <= 1e-6 * float(np.abs(want).max())
