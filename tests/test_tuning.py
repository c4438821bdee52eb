"""Admission's tuning stage (backends/gpu/tuning.py) on wgpu-native (lavapipe here).

- On a software adapter the policy's default keeps the rule, and says why.
- Forced, it measures every decode mat-vec form of the fused program and its choices are what
  the session compiles and runs.
- Choices given by a cache are used without measuring, and the engine on them follows the CPU
  oracle (the same bound as tests/test_gpu_engine_native.py).
- A launch shape that computes the wrong rows is never chosen (the differential check).
- A cache is untrusted: entries that are not choices are ignored and measured afresh; the
  file cache survives a broken file.
Timings themselves are not asserted (lavapipe's numbers mean nothing for a GPU).
"""
from __future__ import annotations

import json

import pytest

import webslm
from webslm.admission.admit import AdmissionPolicy, admit
from webslm.backends.gpu import timing, tuning, tuning_cache, tuning_stage
from webslm.generate import prompt_ids
from webslm.kernels import attention, attention_xq, matvec, matvec_prequant, matvec_rope_kv
from webslm.program.fusion import ALL

from tuning_models import (FORCED, INT8_LOGIT_TOLERANCE, INT8_TWO_BYTE_LOGIT_TOLERANCE,
                           LOGIT_TOLERANCE, errors_against_the_oracle, prequantized_entries)

pytestmark = pytest.mark.usefixtures("self_test_once")


@pytest.fixture(scope="module")
def model(stacked_slm_path):
    return webslm.open_model(stacked_slm_path)


def test_a_software_adapter_keeps_the_rule_and_says_why(native_gpu, model, run):
    async def go():
        session = await admit(native_gpu, model, AdmissionPolicy(fusions=ALL))
        try:
            return session.tuning, session.choices
        finally:
            session.destroy()
    report, choices = run(go())
    assert report.source == "rule" and "software" in report.reason
    assert choices == {} and report.cache_entries == {}


def test_forced_tuning_measures_every_decode_matvec_form(measured, model):
    report, compiled = measured
    assert report.source == "measured", report.reason
    # the fused program's decode mat-vecs: q|k|v (norm input), o (+y), gate|up (norm), down
    # (swiglu, +y) and the head; each form measured once whatever its layer count
    inputs = sorted(form.split(" ")[2] for form in report.forms)
    assert inputs.count("norm") >= 2 and "swiglu" in inputs and "plain" in inputs, report.forms
    for form, facts in report.forms.items():
        most = 13 if form.split(" ")[2] == "norm" else 9      # a norm form's int8 ladder in two ways ("xq2s")
        assert 2 <= facts["tried"] <= most and facts["rule_us"] > 0 and facts["chosen_us"] > 0, (form, facts)
        assert facts["chosen_us"] <= facts["rule_us"]
        assert facts["rejected"] == 0, (form, facts)       # every correct launch passes the check (q8 on xq too)
    assert sorted(key.split("|", 2)[2] for key in _form_entries(report.cache_entries)) == sorted(report.forms)
    # what was chosen is what the session compiled: a mat-vec, or one in a derived form (the
    # q|k|v form runs as "rkv_matvec_..." under rope-kv-into-matmul, a producer of int8 as
    # "qout_matvec_..."); which shapes win is the machine's, so another form's kernel need not
    # share this one's WG and ROWS
    def base(name: str) -> str:
        prefix = next((p for p in matvec_prequant.DERIVED_PREFIXES if name.startswith(p)), "")
        return name[len(prefix):]
    for form, choice in report.choices.items():
        if form in (attention.PREFILL_CHOICE, attention_xq.CHOICE):
            continue                                # test_the_prefill_attention_variant_* below; the step check's verdict
        assert any(base(name).startswith("matvec_") and dict(overrides)["WG"] == choice.workgroup
                   and dict(overrides)["ROWS"] == choice.rows for name, overrides in compiled), form


def _form_entries(entries: dict) -> dict:
    """Cache entries of measured forms, without the step check's fused-quantizer verdict
    (attention_xq.CHOICE): that one is timed on this machine and there only in a run where the
    step without the fused quantizers won."""
    return {key: entry for key, entry in entries.items() if not key.split("|", 2)[2].startswith(attention_xq.CHOICE)}


def _forced_entries(report) -> dict[str, dict]:
    """The measured cache entries with every form's choice moved off the rule (ROWS 16, or 2
    where the rule has 16; the other prefill attention variant): shapes the rule never takes, so
    the session runs only measured ones."""
    entries = {}
    for key, entry in _form_entries(report.cache_entries).items():
        rule = entry["rule"]
        if "ROWS" in rule:
            entries[key] = {**entry, "choice": {**rule, "ROWS": 2 if rule["ROWS"] == 16 else 16}}
        else:                   # the prefill attention's: the variant the rule does not take
            entries[key] = {**entry, "choice": {"variant": next(v for v in attention.PREFILL_VARIANTS
                                                                if v != rule["variant"])}}
    return entries


def test_cached_choices_are_used_without_measuring_and_follow_the_cpu_oracle(native_gpu, model, measured, run):
    report, _ = measured
    cache = _forced_entries(report)
    ids = prompt_ids(model, "hi there", chat=True)

    async def go():
        session = await admit(native_gpu, model, FORCED, tuning_cache=cache)
        assert session.tuning.source == "cached" and session.tuning.cache_entries == {}
        matvecs = [c for key, c in session.choices.items() if key != attention.PREFILL_CHOICE]
        assert {c.rows for c in matvecs} <= {2, 16} and len(session.choices) == len(report.forms)
        assert session.choices[attention.PREFILL_CHOICE].variant == "tiles"     # the rule here: rows
        return await errors_against_the_oracle(session, model, ids), set(session.kernels)
    errors, compiled = run(go())
    assert max(errors) <= LOGIT_TOLERANCE, errors          # the prefill's logits too, on "tiles"
    rows_compiled = {dict(o)["ROWS"] for name, o in compiled if name.startswith("matvec_")}
    assert 16 in rows_compiled or 2 in rows_compiled
    prefill_attention = {name for name, _ in compiled if name.startswith("attention_prefill")}
    assert prefill_attention and all("rows" not in name for name in prefill_attention), prefill_attention


async def _prequantized_run(native_gpu, model, report, ids, variant: str = matvec_prequant.VARIANT):
    """Admit with every served form on the pre-quantized path (from the cache), then the engine
    against the CPU oracle: (errors, compiled kernel names, the self-test report)."""
    session = await admit(native_gpu, model, FORCED, tuning_cache=prequantized_entries(report, variant))
    assert session.tuning.source == "cached"
    kernels, self_test = {name for name, _ in session.kernels}, session.self_test
    return await errors_against_the_oracle(session, model, ids), kernels, self_test


def test_pre_quantized_matvecs_run_the_engine_within_the_int8_bound(native_gpu, model, measured, run):
    """Every q4 form and the q8 head on quantize_x + a packed-dot mat-vec
    (kernels/matvec_prequant.py): the session compiles and self-tests both launches, and the
    engine's logits follow the CPU oracle within INT8_LOGIT_TOLERANCE (int8 activations: a
    stated error, not the exact path's)."""
    report, _ = measured
    errors, names, self_test = run(_prequantized_run(native_gpu, model, report,
                                                     prompt_ids(model, "hi there", chat=True)))
    assert {"quantize_x_norm", "quantize_x_plain"} <= names, names
    # down's input: quantized by gate|up itself (quantize-into-matmul), else by quantize_x_swiglu
    assert "quantize_x_swiglu" in names or any(name.startswith("qout_") for name in names), names
    assert any(name.startswith("matvec_int8_q4_dot4") for name in names), names
    assert any(name.startswith("matvec_int8_q8_xq") for name in names), names       # the tied q8 head
    assert "matvec_prequant" in self_test["families"], self_test
    assert max(errors[1:]) <= INT8_LOGIT_TOLERANCE, errors      # decode steps (prefill runs the exact GEMM)
    assert max(errors[1:]) > LOGIT_TOLERANCE / 100, errors       # int8 activations do move the logits


def test_two_bytes_an_activation_bring_the_pre_quantized_path_close_to_the_exact_one(native_gpu, model, measured,
                                                                                    run):
    """The engine's variant ("xq2": the rounding left over as a second byte, x ~ d (q + r / 64))
    against llama.cpp's one byte ("xq") on the same forms and tokens: its logit error is many
    times smaller (64 in the bound); the one byte's changed greedy tokens on real weights
    (kernels/matvec_prequant.py)."""
    report, _ = measured
    ids = prompt_ids(model, "hi there", chat=True)
    two, names, _ = run(_prequantized_run(native_gpu, model, report, ids, "xq2"))
    one, _, _ = run(_prequantized_run(native_gpu, model, report, ids, "xq"))
    assert any(name.startswith("matvec_int8_q4_dot4") for name in names), names
    assert max(two[1:]) * 8 <= max(one[1:]), (two, one)
    assert max(two[1:]) <= INT8_TWO_BYTE_LOGIT_TOLERANCE, two


def test_pre_quantized_k_quant_matvecs_run_a_q4_k_m_model_within_the_int8_bound(native_gpu, run, q4k_m_slm_path):
    """llama.cpp's Q4_K_M mix (bench/synthetic_model.py --shape kquant --encoding q4k_m): its
    q4k and q6k forms (the tied q6k head, attn_v and ffn_down in the more-bits layer) on the
    pre-quantized path, the same bound."""
    model = webslm.open_model(q4k_m_slm_path)

    async def go():
        session = await admit(native_gpu, model, FORCED)
        report = session.tuning
        session.destroy()
        return await _prequantized_run(native_gpu, model, report, [5, 17, 99, 250, 3, 42, 7])
    errors, names, self_test = run(go())
    assert any(name.startswith("matvec_int8_q4k_xq") for name in names), names
    assert any(name.startswith("matvec_int8_q6k_xq") for name in names), names
    assert max(errors[1:]) <= INT8_LOGIT_TOLERANCE, errors
    assert max(errors[1:]) > LOGIT_TOLERANCE / 100, errors


def test_a_launch_that_computes_the_wrong_rows_is_never_chosen(native_gpu, model, run, monkeypatch):
    """Break ROWS = 16 (its grid covers half the rows): the check against the rule rejects it
    in every form where it was tried, and no form chooses it."""
    grid = matvec.grid

    def half_grid(device, weights, rows_per_group, m):
        return grid(device, weights, rows_per_group * 2 if rows_per_group == 16 else rows_per_group, m)
    monkeypatch.setattr(matvec, "grid", half_grid)
    fused_plan = matvec_rope_kv.plan          # q|k|v with RoPE (rope-kv-into-matmul) has its own grid

    def half_fused(*args, **kwargs):
        p = fused_plan(*args, **kwargs)
        if p.overrides["ROWS"] != 16:
            return p
        return p._replace(grid=(-(-p.grid[0] // 2), p.grid[1], p.grid[2]))
    monkeypatch.setattr(matvec_rope_kv, "plan", half_fused)

    async def go():
        session = await admit(native_gpu, model, FORCED)
        try:
            return session.tuning
        finally:
            session.destroy()
    report = run(go())
    assert report.source == "measured"
    broken = [form for form, facts in report.forms.items() if facts["rejected"] >= 1]
    assert broken, report.forms          # at least the forms with rows > 16 tried it and refused it
    assert all(choice.rows != 16 for choice in report.choices.values() if isinstance(choice, matvec.Choice))


BAD_CHOICES = [{"variant": "", "WG": 7, "ROWS": 4}, {"variant": "", "WG": 32, "ROWS": True},
               {"variant": 3, "WG": 32, "ROWS": 4}, "32x4", {"WG": 32}, [1, 2], 5]


@pytest.mark.parametrize("bad", BAD_CHOICES)
def test_a_choice_from_a_cache_is_typed_or_refused(bad):
    with pytest.raises(matvec.MatvecShapeError):
        matvec.Choice.from_dict(bad)
    assert matvec.Choice.from_dict({"variant": "", "WG": 64, "ROWS": 8}) == matvec.Choice("", 64, 8)


async def _forced_tuning_report(gpu, model, cache):
    """The tuning report of a forced admission with `cache`, the session released."""
    session = await admit(gpu, model, FORCED, tuning_cache=cache)
    try:
        return session.tuning
    finally:
        session.destroy()

def test_a_cache_entry_that_is_not_a_choice_is_measured_afresh(native_gpu, model, measured, run):
    """One mat-vec form's entry broken, and the prefill attention's, one saying "the rule is
    best", the rest moved off the rule: the broken two alone are measured, the others are
    used as cached."""
    report, _ = measured
    cache = _forced_entries(report)
    keys = sorted(key for key in cache if attention.PREFILL_CHOICE not in key)
    (prefill,) = [key for key in cache if attention.PREFILL_CHOICE in key]
    cache[keys[0]] = {**cache[keys[0]], "choice": {"variant": "", "WG": 7, "ROWS": 4}}
    cache[keys[1]] = {**cache[keys[1]], "choice": None}
    cache[prefill] = {**cache[prefill], "choice": {"variant": "rows", "WG": 32}}

    again = run(_forced_tuning_report(native_gpu, model, cache))
    broken, rule = keys[0].split("|", 2)[2], keys[1].split("|", 2)[2]
    assert again.source == "measured" and set(again.forms) == set(report.forms)
    assert sorted(_form_entries(again.cache_entries)) == sorted([keys[0], prefill]) and not again.forms[broken].get("cached")
    assert again.forms[rule]["cached"] and rule not in again.choices
    assert not again.forms[prefill.split("|", 2)[2]].get("cached")
    assert all(again.forms[f]["cached"] and again.choices[f].rows in (2, 16) for f in again.forms
               if f not in (broken, rule, prefill.split("|", 2)[2]))



def test_a_cached_choice_is_taken_only_where_the_form_has_that_launch(native_gpu, model, measured, run,
                                                                    monkeypatch):
    """"xq2s" (the norm's 1/rms from the units' squares) serves a norm input only: cached for a
    norm form it is used as cached; cached for a plain form, or a variant no encoding has (an
    edited or stale cache), that form is measured afresh, never compiled with it. The step
    check is made to keep the int8 forms: timed on the machine, it drops them where the exact
    step wins (a CI machine's lavapipe), which would hide what this test looks at."""
    monkeypatch.setattr(tuning, "STEP_GAIN", -1e9)
    report, _ = measured
    cache = prequantized_entries(report)
    norm = next(key for key in cache if key.split("|", 2)[2].split(" ")[2] == "norm")
    plain = next(key for key in cache if key.split("|", 2)[2].split(" ")[2] == "plain")
    unknown = next(key for key in cache if key not in (norm, plain) and attention.PREFILL_CHOICE not in key)
    for key, variant in ((norm, "xq2s"), (plain, "xq2s"), (unknown, "bogus")):
        cache[key] = {**cache[key], "choice": {"variant": variant, "WG": 32, "ROWS": 4}}

    again = run(_forced_tuning_report(native_gpu, model, cache))
    norm_form, plain_form = norm.split("|", 2)[2], plain.split("|", 2)[2]
    assert again.forms[norm_form]["cached"] and again.choices[norm_form].variant == "xq2s"
    assert not again.forms[plain_form].get("cached") and plain in again.cache_entries
    assert again.choices.get(plain_form) is None or again.choices[plain_form].variant != "xq2s"
    assert not again.forms[unknown.split("|", 2)[2]].get("cached") and unknown in again.cache_entries

def test_the_file_cache_merges_and_survives_a_broken_file(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "matvec-tuning.json"
    monkeypatch.setenv("WEBSLM_TUNING_CACHE", str(path))
    assert tuning_cache.cache_path() == path and tuning_cache.read_cache(path) == {}
    tuning_cache.write_cache(path, {"a|b|f1": {"choice": None}})
    tuning_cache.write_cache(path, {"a|b|f2": {"choice": {"variant": "", "WG": 64, "ROWS": 8}}})
    assert set(tuning_cache.read_cache(path)) == {"a|b|f1", "a|b|f2"}
    for broken in ("{not json", "[1, 2]", json.dumps({"k": 3}), "\udcff"):
        path.write_text(broken, encoding="utf-8", errors="surrogateescape")
        assert tuning_cache.read_cache(path) == {}
    monkeypatch.setenv("WEBSLM_TUNING_CACHE", "off")
    assert tuning_cache.cache_path() is None and tuning_cache.read_cache(None) == {}
    tuning_cache.write_cache(None, {"x": {}})            # nothing to write to: no error


def test_a_plan_too_small_for_the_quantized_activations_refuses_the_pre_quantized_path(native_gpu, model, run,
                                                                                         monkeypatch):
    """The lowering checks xq against the plan's decode.int8_x region before any dispatch: with
    a region of one header only, every pre-quantized trial is refused and none is chosen."""
    from webslm.plan import memory
    monkeypatch.setattr(memory, "int8_x_bytes", lambda arch: 16)

    async def go():
        session = await admit(native_gpu, model, FORCED)
        try:
            return session.tuning
        finally:
            session.destroy()
    report = run(go())
    q4_forms = [facts for form, facts in report.forms.items() if form.startswith("q4")]
    assert q4_forms and all(facts["refused"] >= 1 for facts in q4_forms), report.forms
    assert all(choice.variant not in matvec_prequant.VARIANTS for choice in report.choices.values())


def test_the_runoff_times_the_finalists_in_turn_so_a_drifting_clock_favours_none(run):
    """GPU clocks that speed up while the stage runs make whatever is timed last look fastest
    (on the H200 the pre-quantized shapes, tried last, won forms they lose in the step). The
    runoff times the finalists in turn, each pair of rounds once forward and once reversed, so
    each sees the same drift: with a true ranking of rule 10 us < b 10.4 us < c 10.8 us and every
    measurement 7% faster than the one before, timing them one after the other ranks c first;
    the runoff ranks them truly."""
    true_us = {"rule": 10.0, "b": 10.4, "c": 10.8}

    class DriftingStage:
        def __init__(self):
            self.calls, self.current, self.order = 0, None, []

        async def launches(self, ops, choice):
            self.current = "rule" if choice is None else choice
            return [self.current]

        async def checkpoint_now(self):
            pass

        async def seconds_per_op(self, ops, dispatches, rounds=3):
            self.order.append(dispatches[0])
            self.calls += 1
            return true_us[dispatches[0]] * 0.93 ** self.calls

    one_after_another = DriftingStage()
    sequential = {name: run(one_after_another.seconds_per_op([], [name])) for name in ("rule", "b", "c")}
    assert min(sequential, key=sequential.get) == "c"                  # the drift's winner
    stage = DriftingStage()
    times = run(tuning._runoff(stage, [], ["rule", "b", "c"]))
    assert stage.order == ["rule", "b", "c", "c", "b", "rule"] * timing.PAIRS
    assert sorted(times, key=times.get) == ["rule", "b", "c"]


def _int8_report():
    form_a, form_b = "q4[] 64x64 norm", "q4[] 64x128 swiglu +y"
    report = tuning.TuningReport({form_a: matvec.Choice("xq2", 32, 4), form_b: matvec.Choice("", 64, 2)},
                                 {form_a: {"rule_us": 9.0}, form_b: {"rule_us": 8.0}}, "measured")
    return report, {form_a: matvec.Choice("", 32, 8), form_b: matvec.Choice("", 64, 2)}


@pytest.mark.parametrize("int8_step_us, kept", [(95.0, True), (99.0, False), (120.0, False)])
def test_int8_forms_stay_only_if_the_whole_step_is_faster_with_them(run, int8_step_us, kept):
    """Each int8 form won alone; the step decides (tuning._step_check): the two steps are
    timed in turn, and the int8 forms go back to their best exact choice unless the step with
    them is STEP_GAIN (3%) faster than the 100 us without them."""
    report, exact = _int8_report()
    timed = []

    async def seconds_per_step(choices):
        uses_int8 = any(c.variant == "xq2" for c in choices.values())
        timed.append(uses_int8)
        return (int8_step_us if uses_int8 else 100.0) * 1e-6
    run(tuning._step_check(report, exact, seconds_per_step))
    assert timed == [True, False, False, True] * timing.PAIRS
    assert report.step_us == {"int8": int8_step_us, "exact": 100.0}
    form_a, form_b = sorted(exact)[1], sorted(exact)[0]
    if kept:
        assert report.choices[form_a].variant == "xq2" and "dropped" not in report.reason
    else:
        assert report.choices == exact, report.choices       # every form on its best exact choice
        assert report.forms[form_a]["step_dropped"] and "int8 forms dropped" in report.reason
    assert report.choices[form_b] == matvec.Choice("", 64, 2)


def test_dropping_the_int8_forms_keeps_the_budgets_reason(run):
    """A search cut short by its budget and then dropping its int8 forms says both: the
    drop's sentence used to replace the budget's, so a report (and the budget test above, when
    lavapipe's step happened to be slower with int8) lost why forms were searched less."""
    report, exact = _int8_report()
    report.reason = "budget of 1.0 s spent: the forms that cost the step least were searched less"

    async def seconds_per_step(choices):
        return (120.0 if any(c.variant == "xq2" for c in choices.values()) else 100.0) * 1e-6
    run(tuning._step_check(report, exact, seconds_per_step))
    assert report.reason.startswith("budget of 1.0 s spent") and "int8 forms dropped" in report.reason


def test_a_whole_decode_step_is_timed_with_and_without_int8_forms(native_gpu, model, measured, run):
    """Stage.seconds_per_step records the decode program's every op with the given choices
    (the int8 ones with their quantizer launches) and times it on the device."""
    report, _ = measured
    choices = {key: matvec.Choice.from_dict(entry["choice"])
               for key, entry in prequantized_entries(report).items() if entry["choice"]}
    assert any(c.variant == "xq2" for c in choices.values())

    async def go():
        import time
        session = await admit(native_gpu, model, AdmissionPolicy(fusions=ALL, tuning="off"))
        try:
            stage = tuning_stage.Stage(session.device, model, session.plan, session.buffers, None, time.perf_counter)
            try:
                return await stage.seconds_per_step(choices), await stage.seconds_per_step({}), stage
            finally:
                stage.release()
        finally:
            session.destroy()
    with_int8, exact, stage = run(go())
    assert with_int8 > 0 and exact > 0 and stage.lowering.choices == {}


def test_a_budget_spent_early_still_gives_every_form_its_first_look(native_gpu, model, run, monkeypatch):
    """The search runs in rounds (tuning._FormSearch): each form's likeliest win (int8 at
    XQ_SHAPES[1] where the pre-quantized path serves it, else its ROWS ladder) before the rest of
    any form's ladder. A clock that jumps ahead by a fixed cost per compiled and checked shape
    spends the budget just before the second round: every form got its first look, none more,
    its first look was timed, and the forms cut short are cached as such (a second admission
    takes them unmeasured, and its budget goes to the forms not searched)."""
    import time
    order, offset = [], [0.0]
    real_check = tuning._FormSearch._check

    async def counted(self, choice, relative):
        order.append((self.key, choice))
        await real_check(self, choice, relative)
        offset[0] += cost[0]
    monkeypatch.setattr(tuning._FormSearch, "_check", counted)
    cost = [0.0]

    async def go():
        session = await admit(native_gpu, model, AdmissionPolicy(fusions=ALL, tuning="off"))
        try:
            stage = tuning_stage.Stage(session.device, model, session.plan, session.buffers, None, time.perf_counter)
            forms = stage.forms()
            served = {key for key, ops in forms.items()
                      if matvec_prequant.serves(session.device, stage.lowering.matvec_form(ops[0])[1])}
            norm = {key for key, ops in forms.items() if ops[0].option("input") == "norm"}
            stage.release()
            first_looks = (len(served) + len(served & norm)           # a norm form's two ways ("xq2s")
                           + (len(matvec.ROWS_PER_WORKGROUP) - 1) * (len(forms) - len(served)))
            cost[0] = 1000.0 / (first_looks - 0.5)      # the budget ends after the first looks
            report = await tuning.tune(session.device, model, session.plan, session.buffers, force=True,
                                       budget_seconds=1000.0, clock=lambda: time.perf_counter() + offset[0])
            return report, forms, served, norm, first_looks
        finally:
            session.destroy()
    report, forms, served, norm, first_looks = run(go())
    assert served, "the stacked model's q4 forms are served by the pre-quantized path"
    assert len(order) == first_looks, order
    for key in forms:
        tried = [choice for form, choice in order if form == key]
        if key in served:
            assert tried == [matvec.Choice(variant, *tuning.XQ_SHAPES[1])
                             for variant in ["xq2"] + (["xq2s"] if key in norm else [])], (key, tried)
        else:
            assert [c.variant for c in tried] == [""] * (len(matvec.ROWS_PER_WORKGROUP) - 1), (key, tried)
        assert report.forms[key]["tried"] == 1 + len(tried)         # the rule and the first look, timed
    assert "budget" in report.reason
    cut = {key for key, facts in report.forms.items() if facts.get("cut")}
    assert cut == set(forms)                  # every form's second phase was cut
    cached = {key.split("|", 2)[2]: entry for key, entry in report.cache_entries.items()}
    assert all(cached[form]["cut"] for form in forms)


def test_a_timed_round_is_taken_less_its_round_trip(run):
    """Each timed round ends with a read back to the host. With few dispatches a round is
    mostly that round trip: during the stage on the H200 the SmolLM2 head's one dispatch
    measured 254 us, 32 in the step. The stage measures an empty round's trip at each settle
    (timing.round_trip) and subtracts it: on a device whose read costs 300 us beyond its
    dispatches' 30 us each, a dispatch measures 30 us (330 without the subtraction)."""
    import types

    class Device:
        def __init__(self):
            self.now, self.pending = 0.0, 0

        async def read_buffer(self, *_):
            self.now += 300e-6 + 30e-6 * self.pending
            self.pending = 0
            return bytes(4)

        def submit(self, batch):
            self.pending += len(batch)

    device = Device()
    stage = object.__new__(tuning_stage.Stage)
    stage.device, stage.clock, stage.trip = device, lambda: device.now, 0.0
    stage._bind = lambda role, ref: types.SimpleNamespace(buffer="y", offset=0)
    ops = [types.SimpleNamespace(write=lambda role: "y")]

    untreated = run(stage.seconds_per_op(ops, ["head"], rounds=0))
    stage.trip = run(timing.round_trip(device, stage._sync(ops), stage.clock))
    assert stage.trip == pytest.approx(300e-6)
    assert untreated == pytest.approx(330e-6)
    assert run(stage.seconds_per_op(ops, ["head"])) == pytest.approx(30e-6)


@pytest.mark.parametrize("looks, slow, taken", [
    ([2.2e-3, 30e-6], False, 2),             # the H200's cold first look, then its warm one
    ([40e-6], False, 1),                     # a fast first look is enough
    ([3e-3, 2e-3, 1e-3], True, 3),           # slow every time: a slow adapter, no tuning
    ([3e-3, 2e-3, 1e-3, 1e-4], True, 3),     # a fourth look is never taken
    ([3e-3, 6e-4, 4.9e-4], False, 3),        # the fastest look decides, not the last
])
def test_a_slow_first_look_at_the_rule_is_looked_at_again_before_tuning_is_skipped(run, looks, slow, taken):
    """The rule's first look is its pipeline's first use, right after admission's compiles:
    on the H200 it once read over 0.5 ms a dispatch, and the 8B was left untuned (133.6 tok/s
    where 269 was measured in the runs around it). A slow first look is timed again, at most
    SLOW_LOOKS times, and the fastest decides."""
    assert timing.SLOW_LOOKS == 2 and timing.SLOW_DISPATCH_SECONDS == 5e-4
    given = iter(looks)
    count = []

    async def look():
        count.append(1)
        return next(given)
    assert run(timing.looks_slow(look)) is slow
    assert len(count) == taken


def test_the_choice_is_made_among_the_finalists_the_runoff_timed(run):
    """The runoff times the rule, the best exact and the best int8 shape again; a shape that
    was not among them keeps its round's time, taken while the clocks moved, and must not win
    on it: here the runoff found b slower (15 us) than d's round figure (12 us), and b, the
    finalist, is chosen, not d."""
    import types
    rule, b, d = matvec.Choice("", 32, 4), matvec.Choice("", 32, 8), matvec.Choice("", 32, 16)
    search = object.__new__(tuning._FormSearch)
    search.rule, search.times, search.refused, search.rejected, search.cut = rule, {rule: 20e-6, b: 10e-6, d: 12e-6}, [], [], False
    search.stage, search.key = types.SimpleNamespace(lowering=types.SimpleNamespace(choices={})), "form"
    assert search.finalists() == [rule, b]
    form = search.finish({rule: 20e-6, b: 15e-6})
    assert form["choice"] == b and form["chosen_us"] == 15.0
