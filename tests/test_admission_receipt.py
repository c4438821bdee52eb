"""CapabilityReceiptV1 (privacy-minimized evidence of admission) and pipeline / bind-group identity."""
import dataclasses
import datetime
import importlib.util
import json

import pytest

from webslm.admission import pipeline_key as pk
from webslm.admission import receipt as rc
from webslm.webgpu.interface import AdapterSummary

# The design report's CapabilityReceiptV1, field for field, in its order.
REPORT_FIELDS = [
    "backend_protocol_version", "runtime_build_hash", "shader_bundle_hash",
    "self_test_suite_hash", "model_artifact_hash", "model_layout_profile",
    "browser_engine_major_bucket", "operating_system_family_bucket", "feature_level",
    "enabled_feature_bits", "admitted_limit_profile_id", "fallback_adapter", "outcome_code",
    "failure_stage", "receipt_day",
]

# User agents as these machines' browsers report them (bench/results/boot.json).
UA_CHROMIUM_156 = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
                   "HeadlessChrome/156.0.0.0 Safari/537.36")
UA_FIREFOX_ESR_153 = "Mozilla/5.0 (X11; Linux x86_64; rv:153.0) Gecko/20100101 Firefox/153.0"
UA_WEBKITGTK_250 = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/605.1.15 (KHTML, like Gecko) "
                    "Version/60.5 Safari/605.1.15")

# The native lavapipe adapter as wgpu-native 0.32 describes it here.
LAVAPIPE = AdapterSummary(
    feature_level="core", features=("shader-f16", "subgroups", "timestamp-query"),
    limits={"maxStorageBufferBindingSize": 134217728, "maxComputeWorkgroupStorageSize": 32768,
            "maxComputeInvocationsPerWorkgroup": 1024},
    vendor="llvmpipe", architecture="", description="llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, CPU)",
    is_fallback=True)

NOON = datetime.datetime(2026, 11, 30, 14, 5, 33, 123456, tzinfo=datetime.timezone.utc)
HASH = "ab" * 32


def make_receipt(**changes) -> rc.CapabilityReceiptV1:
    facts = dict(outcome="admitted", feature_level="core", user_agent=None,
                 native_platform="linux", adapter=LAVAPIPE, requested_features=["shader-f16"],
                 limits=LAVAPIPE.limits, now=NOON, runtime_build=HASH,
                 bundle_hash=HASH, suite_hash=HASH)
    return rc.build_receipt(**{**facts, **changes})


# -- the receipt's fields ----------------------------------------------------------------------

def test_receipt_has_exactly_the_reports_fields():
    assert [f.name for f in dataclasses.fields(rc.CapabilityReceiptV1)] == REPORT_FIELDS
    assert list(make_receipt().as_dict()) == REPORT_FIELDS


def test_built_receipt_holds_buckets_and_nothing_of_the_adapter(fixture_slm_path):
    from webslm.artifact.validate import validate_file
    model = validate_file(fixture_slm_path)
    receipt = make_receipt(model=model)
    data = receipt.as_dict()
    assert data["model_artifact_hash"] == model.identity.artifact_sha256
    assert data["model_layout_profile"] == "q4+q8+f16+f32/1M"
    assert data["browser_engine_major_bucket"] == "native-wgpu"
    assert data["operating_system_family_bucket"] == "linux"
    assert data["enabled_feature_bits"] == ["shader-f16"]   # requested, not all offered
    assert data["admitted_limit_profile_id"] == "bind128M-wg32K-inv1024"
    assert data["fallback_adapter"] is True
    assert data["receipt_day"] == "2026-11-30"
    text = json.dumps(data) + rc.render_text(receipt)
    for private in ("llvmpipe", "LLVM", "Vulkan", "14:05", "134217728", "1024,"):
        assert private not in text
    # JSON round trip, and the transmitted form leaves the local model identity out
    assert json.loads(json.dumps(data)) == data
    assert "model_artifact_hash" not in receipt.as_dict(include_local_only=False)
    rc.check_privacy(receipt.as_dict(include_local_only=False))


def test_real_runtime_hashes_are_filled_in():
    receipt = make_receipt(runtime_build=None, bundle_hash=None, suite_hash=None)
    from webslm import shader_bundle
    assert receipt.shader_bundle_hash == shader_bundle.bundle_hash()
    assert receipt.runtime_build_hash == rc.runtime_build_hash()
    assert receipt.runtime_build_hash != rc.runtime_build_hash(version="0.0.0-other")
    assert receipt.self_test_suite_hash == rc.self_test_suite_hash()


def test_failure_receipt_names_its_stage_and_text_block_shows_it():
    receipt = make_receipt(outcome="no-webgpu", failure_stage="entry-point",
                           user_agent=UA_WEBKITGTK_250, adapter=None, requested_features=(),
                           limits={}, feature_level=None)
    assert not receipt.admitted
    assert (receipt.admitted_limit_profile_id, receipt.fallback_adapter) == ("none", False)
    assert receipt.feature_level == "none"
    text = rc.render_text(receipt)
    assert "no-webgpu (at stage entry-point)" in text and "webkit-6xx" in text
    with pytest.raises(rc.ReceiptPrivacyError):
        make_receipt(outcome="no-webgpu", failure_stage=None)
    with pytest.raises(rc.ReceiptPrivacyError):
        make_receipt(outcome="admitted", failure_stage="compile")


# -- privacy -----------------------------------------------------------------------------------

@pytest.mark.parametrize("plant, code", [
    ({"adapter_description": "llvmpipe (LLVM 15.0.6, 256 bits)"}, "receipt-unknown-field"),
    ({"outcome_code": "llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan, CPU)"}, "receipt-secret"),
    ({"failure_stage": "nvidia-driver-550-54"}, "receipt-vendor-string"),
    ({"outcome_code": "failed-mesa-23-2"}, "receipt-vendor-string"),
    ({"receipt_day": "2026-11-30T14:05:33Z"}, "receipt-time-of-day"),
    ({"receipt_day": "2026-11-30 14"}, "receipt-time-of-day"),
    ({"token_ids": [1, 9038, 2]}, "receipt-unknown-field"),
    ({"enabled_feature_bits": [1, 9038, 2]}, "receipt-number"),
    ({"admitted_limit_profile_id": 134217728}, "receipt-number"),
    ({"prompt": "What is the capital of France?"}, "receipt-unknown-field"),
    ({"enabled_feature_bits": ["subgroups", "chromium-experimental-x"]}, "receipt-bad-value"),
    ({"model_layout_profile": "The capital of France is Paris."}, "receipt-bad-value"),
    ({"browser_engine_major_bucket": UA_CHROMIUM_156}, "receipt-bad-value"),
])
def test_check_privacy_catches_planted_content(plant, code):
    data = {**make_receipt().as_dict(), **plant}
    if "failure_stage" in plant:        # a failure stage goes with a failure outcome
        data["outcome_code"] = "compile-failed"
    with pytest.raises(rc.ReceiptPrivacyError) as caught:
        rc.check_privacy(data, secrets=[LAVAPIPE.description, LAVAPIPE.vendor])
    assert caught.value.code == code


def test_the_caller_known_secret_is_caught_anywhere():
    data = {**make_receipt().as_dict(), "outcome_code": "admitted"}
    rc.check_privacy(data, secrets=["SwiftShader Device (Subzero)"])
    data["model_layout_profile"] = "q4/64M"
    rc.check_privacy(data)
    with pytest.raises(rc.ReceiptPrivacyError) as caught:
        rc.check_privacy({**data, "outcome_code": "zz-secretgpu-9"}, secrets=["SecretGPU"])
    assert caught.value.code == "receipt-secret"
    # whole tokens only: an architecture name inside a longer word is no leak
    rc.check_privacy({**data, "outcome_code": "zz-secretgpus-9", "failure_stage": "compile"},
                     secrets=["secretgpu"])


def test_admission_calls_it_natively_with_a_model_object(fixture_slm_path):
    import webslm
    model = webslm.open_model(fixture_slm_path)
    receipt = make_receipt(user_agent="native", native_platform="darwin", model=model)
    assert (receipt.browser_engine_major_bucket, receipt.operating_system_family_bucket) == \
        ("native-wgpu", "macos")
    assert receipt.model_artifact_hash == model.identity.artifact_sha256


def test_a_receipt_cannot_be_constructed_with_forbidden_content():
    good = make_receipt()
    with pytest.raises(rc.ReceiptPrivacyError):
        dataclasses.replace(good, receipt_day="2026-11-30T14:05")
    with pytest.raises(rc.ReceiptPrivacyError):
        dataclasses.replace(good, browser_engine_major_bucket=UA_FIREFOX_ESR_153)
    with pytest.raises(ValueError):
        make_receipt(requested_features=["subgroups", "vendor-private-feature"])
    with pytest.raises(ValueError):
        make_receipt(now=datetime.datetime(2026, 11, 30, 23, 0))     # naive: day ambiguous


def test_receipt_day_is_the_utc_day():
    late_in_new_york = datetime.datetime(2026, 11, 30, 22, 30,
                                         tzinfo=datetime.timezone(datetime.timedelta(hours=-5)))
    assert rc.utc_day(late_in_new_york) == "2026-12-01"
    assert rc.utc_day(datetime.date(2026, 1, 2)) == "2026-01-02"


# -- buckets -----------------------------------------------------------------------------------

@pytest.mark.parametrize("ua, engine, system", [
    (UA_CHROMIUM_156, "chromium-15x", "linux"),
    (UA_FIREFOX_ESR_153, "firefox-15x", "linux"),
    (UA_WEBKITGTK_250, "webkit-6xx", "linux"),
    (None, "native-wgpu", "linux"),
    ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/149.0.0.0 Safari/537.36 Edg/149.0.0.0", "chromium-14x", "windows"),
    ("Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) "
     "Version/26.0 Safari/605.1.15", "webkit-6xx", "macos"),
    ("Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/156.0.0.0 Mobile Safari/537.36", "chromium-15x", "android"),
    ("Mozilla/5.0 (iPhone; CPU iPhone OS 18_6 like Mac OS X) AppleWebKit/605.1.15 "
     "(KHTML, like Gecko) CriOS/156.0.0.0 Mobile/15E148 Safari/604.1", "webkit-6xx", "ios"),
    ("Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) AppleWebKit/537.36 (KHTML, like Gecko) "
     "Chrome/156.0.0.0 Safari/537.36", "chromium-15x", "other"),
    ("curl/8.5.0", "other", "other"),
])
def test_user_agent_buckets(ua, engine, system):
    assert rc.browser_engine_bucket(ua) == engine
    assert rc.os_family_bucket(ua, native_platform="linux") == system


def test_native_platform_buckets():
    assert [rc.os_family_bucket(None, p) for p in ("linux", "win32", "darwin", "emscripten")] == \
        ["linux", "windows", "macos", "other"]


@pytest.mark.parametrize("row, limits, profile", [
    # docs/RESULTS.md, "Adapters as the browsers expose them"; shared/ENVIRONMENT.md
    ("chromium (SwiftShader)", (1 << 30, 32 << 10, 256), "bind1G-wg32K-inv256"),
    # a compatibility device that asks for nothing gets WebGPU's compatibility defaults
    ("chromium compatibility (ANGLE, lavapipe)", (128 << 20, 16 << 10, 128), "bind128M-wg16K-inv128"),
    ("firefox (wgpu, lavapipe)", (128 << 20, 32 << 10, 1024), "bind128M-wg32K-inv1024"),
    ("native lavapipe", (134217728, 32768, 1024), "bind128M-wg32K-inv1024"),
    # buckets mean "at least": 2^31 - 1 bytes is not 2 GiB
    ("rounds down", ((1 << 31) - 1, 48 << 10, 1023), "bind1G-wg48K-inv512"),
    ("beyond the top step", (64 << 30, 1 << 20, 4096), "bind4G-wg64K-inv1024"),
    ("below the first step", (64 << 20, 8 << 10, 64), "bind0-wg0-inv0"),
])
def test_limit_profiles(row, limits, profile):
    names = [name for name, _, _ in rc.LIMIT_STEPS]
    assert rc.limit_profile_id(dict(zip(names, limits), maxBufferSize=1 << 40)) == profile, row


def test_model_layout_profile_from_encodings_and_size():
    Tensor = dataclasses.make_dataclass("Tensor", ["encoding", "nbytes"])
    smollm2 = [Tensor("q4", 60 << 20), Tensor("q8", 28 << 20), Tensor("f32", 1 << 20)]
    assert rc.model_layout_profile(smollm2) == "q4+q8+f32/64M"
    assert rc.model_layout_profile([Tensor("f16", 3 << 30)]) == "f16/2G"
    assert rc.model_layout_profile([]) == "none"


# -- the self-test suite hash ------------------------------------------------------------------

def test_self_test_suite_hash_follows_the_golden_sources(tmp_path, monkeypatch):
    from webslm.kernels import golden
    base = rc.self_test_suite_hash()
    assert base == rc.self_test_suite_hash()
    module_file = tmp_path / "golden_extra.py"
    module_file.write_text("async def test(context):\n    return []\n")
    spec = importlib.util.spec_from_file_location("golden_extra", module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(golden.FAMILIES, "zz-extra", module.test)
    added = rc.self_test_suite_hash()
    assert added != base
    module_file.write_text("async def test(context):\n    return []  # tolerance changed\n")
    assert rc.self_test_suite_hash() not in (base, added)
    # a family's own module edited: swap the file a real family is read from
    family = sorted(golden.FAMILIES)[0]
    monkeypatch.setitem(golden.FAMILIES, family, module.test)
    assert rc.self_test_suite_hash() not in (base, added)
    monkeypatch.undo()
    assert rc.self_test_suite_hash() == base


# -- pipeline keys -----------------------------------------------------------------------------

BASE_KEY = dict(
    backend_abi_version=pk.BACKEND_ABI_VERSION, runtime_build_hash=HASH,
    complete_wgsl_source_hash="cd" * 32, entry_point="main",
    specialization_constant_map=(("BLOCK", 32), ("WG", 128)),
    quant_descriptor_version=pk.QUANT_DESCRIPTOR_VERSION, tensor_layout_profile_hash="ef" * 32,
    enabled_feature_bits=("shader-f16",), requested_limit_profile="bind128M-wg32K-inv1024",
    feature_level="core", browser_engine_major_bucket="firefox-15x",
    coarse_native_backend_class="browser-webgpu", shader_compiler_pipeline_version_if_public=None,
)
OTHER_VALUE = dict(
    backend_abi_version="webslm-gpu-abi-2", runtime_build_hash="12" * 32,
    complete_wgsl_source_hash="34" * 32, entry_point="main_tail",
    specialization_constant_map=(("BLOCK", 32), ("WG", 256)),
    quant_descriptor_version="slm-v2", tensor_layout_profile_hash="56" * 32,
    enabled_feature_bits=("shader-f16", "subgroups"), requested_limit_profile="bind1G-wg32K-inv256",
    feature_level="compatibility", browser_engine_major_bucket="firefox-16x",
    coarse_native_backend_class="wgpu-native-vulkan",
    shader_compiler_pipeline_version_if_public="naga-27",
)


def test_pipeline_key_lists_every_field_of_the_report():
    assert set(BASE_KEY) == set(OTHER_VALUE) == {f.name for f in dataclasses.fields(pk.PipelineKey)}
    assert len(BASE_KEY) == 13


@pytest.mark.parametrize("field", sorted(BASE_KEY))
def test_pipeline_keys_differ_when_any_field_differs(field):
    base, changed = pk.PipelineKey(**BASE_KEY), pk.PipelineKey(**{**BASE_KEY, field: OTHER_VALUE[field]})
    assert changed != base and changed.digest() != base.digest()


def test_equal_facts_give_equal_keys():
    first, second = pk.PipelineKey(**BASE_KEY), pk.PipelineKey(**dict(reversed(BASE_KEY.items())))
    assert first == second and hash(first) == hash(second) and first.digest() == second.digest()
    assert {first: "pipeline"}[second] == "pipeline"
    with pytest.raises(ValueError):   # unsorted overrides would make equal facts unequal keys
        pk.PipelineKey(**{**BASE_KEY, "specialization_constant_map": (("WG", 128), ("BLOCK", 32))})


def test_pipeline_key_hashes_the_wgsl_actually_compiled():
    from webslm.kernels.registry import KERNELS
    spec = next(s for _, s in sorted(KERNELS.items()) if "enable_subgroups.wgsl" in s.sources)
    overrides = {name: values[0] for name, values in spec.overrides.items()}
    facts = dict(device_features=["subgroups"], device_limits=LAVAPIPE.limits, feature_level="core",
                 browser_bucket="native-wgpu", backend_class=pk.native_backend_class("Vulkan"),
                 tensor_layout_hash="ef" * 32, runtime_build=HASH)
    browser = pk.pipeline_key(spec, overrides, **facts)
    naga = pk.pipeline_key(spec, overrides, implicit_enables=frozenset({"subgroups"}), **facts)
    import hashlib
    assert browser.complete_wgsl_source_hash == hashlib.sha256(spec.source().encode()).hexdigest()
    assert naga.complete_wgsl_source_hash != browser.complete_wgsl_source_hash
    assert browser.entry_point == spec.entry_point
    assert browser.specialization_constant_map == tuple(sorted(overrides.items()))
    assert browser.coarse_native_backend_class == "wgpu-native-vulkan"
    assert pk.pipeline_key(spec, overrides, **facts) == browser


def test_tensor_layout_hash_ignores_shapes_but_not_decoding(fixture_slm_path):
    from webslm.artifact.validate import validate_file
    tensors = list(validate_file(fixture_slm_path).manifest.tensors.values())
    base = pk.tensor_layout_profile_hash(tensors)
    reshaped = [dataclasses.replace(t, shape=(1, 7)) for t in tensors]
    assert pk.tensor_layout_profile_hash(reshaped) == base
    quantized = next(t for t in tensors if t.quant is not None)
    other = dataclasses.replace(quantized, quant=dataclasses.replace(
        quantized.quant, nibble_order="high-first"))
    assert pk.tensor_layout_profile_hash(tensors + [other]) != base


# -- bind groups -------------------------------------------------------------------------------

def test_bind_group_keys_differ_across_buffer_generations():
    identities, device = pk.BufferIdentities(), pk.new_device_token()
    weights = identities.issue("layer0.wq")

    def key(ref, epoch=1, dev=device):
        return pk.BindGroupKey(dev, "pipeline:group0", (pk.BoundRange(ref, 0, 4096),), epoch)

    same = key(identities.current("layer0.wq"))
    assert same == key(weights)
    # model switch: the buffer is destroyed and a new one created under the same id
    identities.retire("layer0.wq")
    reused = identities.issue("layer0.wq")
    assert reused.buffer_id == weights.buffer_id and key(reused) != key(weights)
    assert key(weights, epoch=2) != key(weights)
    assert key(weights, dev=pk.new_device_token()) != key(weights)
    assert pk.BindGroupKey(device, "pipeline:group0", (pk.BoundRange(weights, 256, 4096),), 1) \
        != key(weights)


def test_bind_group_cache_invalidation():
    identities, cache = pk.BufferIdentities(), pk.BindGroupCache()
    dev_a, dev_b = pk.new_device_token(), pk.new_device_token()
    buffers = [identities.issue(name) for name in ("x", "y")]
    created = []

    def make(dev, ref, epoch):
        key = pk.BindGroupKey(dev, "layout", (pk.BoundRange(ref, 0, None),), epoch)
        return cache.get_or_create(key, lambda: created.append(key) or f"group{len(created)}")

    first = make(dev_a, buffers[0], 1)
    assert make(dev_a, buffers[0], 1) == first and len(created) == 1    # a hit creates nothing
    make(dev_a, buffers[1], 1), make(dev_b, buffers[0], 1), make(dev_b, buffers[1], 2)
    assert len(cache) == 4
    assert cache.invalidate(buffer=buffers[1]) == 2          # every group binding y
    assert cache.invalidate(epoch=1) == 2 and len(cache) == 0
    make(dev_a, buffers[0], 3), make(dev_b, buffers[0], 3)
    assert cache.invalidate(device_token=dev_a) == 1 and len(cache) == 1
    with pytest.raises(ValueError):
        cache.invalidate()
