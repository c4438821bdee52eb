"""CapabilityReceiptV1: the coarse, privacy-minimized evidence that admission leaves behind.

Admission (issue 7) learns a great deal about the machine: the adapter's vendor and driver
strings, every limit, how long each step took. It keeps that in memory for scheduling and
persists only this receipt, whose fields are exactly the design report's (section
"Privacy-minimized capability receipt"). Every field is either a hash of our own code and
model, or a bucket from a short, fixed list, so that a receipt says which class of machine
admitted which model, never which machine.

Two lines of defence keep forbidden content (prompts, generated text, token ids, the raw
adapter description, vendor/architecture/driver strings, precise device ids, times of day,
memory-probe frontiers, shader/compiler diagnostics) out:
- `build_receipt` takes no such inputs, except the adapter summary, of which it reads only
  `is_fallback` (its strings are used solely to prove they did not leak);
- the receipt validates itself on construction: every field must match its allow-listed
  shape, and `check_privacy` rejects anything else (unknown keys, numbers, times with hours,
  vendor words, or any string the caller knows to be secret).

Buckets (docs/architecture.md, "Capability receipt and pipeline identity"):
- browser engine: the engine's major version in decades ("chromium-15x", "firefox-15x"),
  WebKit's frozen AppleWebKit/6xx token ("webkit-6xx"), "native-wgpu" without a browser;
- operating system: one of OS_FAMILIES;
- limits: three limits rounded down to listed steps, e.g. "bind128M-wg16K-inv128";
- model layout: the encodings present plus the weight bytes rounded down to a power of two,
  e.g. "q4+q8+f32/64M".
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import inspect
import pathlib
import re
import sys
from typing import Any, Iterable, Mapping

from ..errors import CodedError
from ..webgpu.interface import FEATURE_LEVELS, WEBGPU_FEATURES, AdapterSummary

BACKEND_PROTOCOL_VERSION = "tiny-gpu-admission-v1"
OUTCOME_ADMITTED = "admitted"

# Fields naming local content: kept on this machine, left out of `as_dict(include_local_only=
# False)`, the form meant for anything that leaves it (the report: "not transmitted by default").
LOCAL_ONLY_FIELDS = ("model_artifact_hash",)

# A receipt may record only standard feature names (webgpu/interface.py WEBGPU_FEATURES): a
# name outside that list would be non-standard, hence a fingerprint, and is refused.

OS_FAMILIES = ("linux", "windows", "macos", "android", "ios", "other")

# Limit steps (ascending). A device's limit is recorded as the largest step it reaches: the
# bucket says "at least this much", so 2^31 - 1 bytes counts as 1G, not 2G. The first step of
# each list is WebGPU's core default; "0" records a value below it (compatibility devices).
LIMIT_STEPS = (
    ("maxStorageBufferBindingSize", "bind",
     (128 << 20, 256 << 20, 512 << 20, 1 << 30, 2 << 30, 4 << 30)),
    ("maxComputeWorkgroupStorageSize", "wg", (16 << 10, 32 << 10, 48 << 10, 64 << 10)),
    ("maxComputeInvocationsPerWorkgroup", "inv", (128, 256, 512, 1024)),
)

# the order they appear in a layout profile; the CPU-only ones last, so older profiles read the same
MODEL_ENCODINGS = ("q4", "q8", "f16", "f32", "q5", "q4k", "q5k", "q6k")


class ReceiptPrivacyError(CodedError):
    """A receipt (or a dict claiming to be one) holds something it must not."""


# -- the receipt ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CapabilityReceiptV1:
    backend_protocol_version: str
    runtime_build_hash: str
    shader_bundle_hash: str
    self_test_suite_hash: str
    model_artifact_hash: str | None        # local identity; see LOCAL_ONLY_FIELDS
    model_layout_profile: str
    browser_engine_major_bucket: str
    operating_system_family_bucket: str
    feature_level: str                      # "core" | "compatibility" | "none" (no adapter)
    enabled_feature_bits: tuple[str, ...]   # sorted names from WEBGPU_FEATURES
    admitted_limit_profile_id: str
    fallback_adapter: bool
    outcome_code: str
    failure_stage: str | None
    receipt_day: str                        # "YYYY-MM-DD", UTC

    def __post_init__(self):
        # A receipt built by hand, bypassing build_receipt, is held to the same rules.
        check_privacy(self.as_dict())

    def as_dict(self, include_local_only: bool = True) -> dict[str, Any]:
        """The receipt as JSON-able data; include_local_only=False for anything transmitted."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["enabled_feature_bits"] = list(self.enabled_feature_bits)
        if not include_local_only:
            for name in LOCAL_ONLY_FIELDS:
                del data[name]
        return data

    @property
    def admitted(self) -> bool:
        return self.outcome_code == OUTCOME_ADMITTED


RECEIPT_FIELDS = tuple(f.name for f in dataclasses.fields(CapabilityReceiptV1))


def build_receipt(*, outcome: str, feature_level: str | None, failure_stage: str | None = None,
                  user_agent: str | None = None, native_platform: str | None = None,
                  adapter: AdapterSummary | None = None, requested_features: Iterable[str] = (),
                  limits: Mapping[str, int] | None = None, model=None,
                  now: datetime.datetime | datetime.date | None = None,
                  runtime_build: str | None = None, bundle_hash: str | None = None,
                  suite_hash: str | None = None) -> CapabilityReceiptV1:
    """Bucket the raw facts of one admission into a receipt.

    outcome: "admitted" or the failure code; failure_stage: None or the stage that failed.
    feature_level: the adapter's ("core" | "compatibility"); None when no adapter was
    obtained, recorded as "none". user_agent: navigator.userAgent in the browser; None or
    "native" natively (native_platform then defaults to sys.platform). adapter: only
    `is_fallback` is recorded. requested_features: the features admission asked the device
    for (not all the adapter offers). limits: the admitted device's limits (None or empty
    when no device was created). model: the ValidatedModelManifest, or a model object
    holding one as `.manifest` (ValidatedModel, webslm.Model); None before there is one.
    now: when admission finished (default: the current UTC time); only its UTC day is kept.
    runtime_build / bundle_hash / suite_hash default to this installation's."""
    manifest = getattr(model, "manifest", model)
    if user_agent == "native":
        user_agent = None
    if bundle_hash is None:
        from .. import shader_bundle
        bundle_hash = shader_bundle.bundle_hash()
    receipt = CapabilityReceiptV1(
        backend_protocol_version=BACKEND_PROTOCOL_VERSION,
        runtime_build_hash=runtime_build or runtime_build_hash(bundle_hash=bundle_hash),
        shader_bundle_hash=bundle_hash,
        self_test_suite_hash=suite_hash or self_test_suite_hash(),
        model_artifact_hash=manifest.identity.artifact_sha256 if manifest is not None else None,
        model_layout_profile=model_layout_profile(
            manifest.tensors.values() if manifest is not None else ()),
        browser_engine_major_bucket=browser_engine_bucket(user_agent),
        operating_system_family_bucket=os_family_bucket(user_agent, native_platform),
        feature_level=feature_level or "none",
        enabled_feature_bits=feature_names(requested_features),
        admitted_limit_profile_id=limit_profile_id(limits),
        fallback_adapter=bool(adapter.is_fallback) if adapter is not None else False,
        outcome_code=outcome,
        failure_stage=failure_stage,
        receipt_day=utc_day(now),
    )
    # The adapter's strings never went in; prove it, so a future edit that routes one through
    # (say, into a failure code) fails here rather than in someone's log.
    secrets = [adapter.vendor, adapter.architecture, adapter.description] if adapter else []
    check_privacy(receipt.as_dict(), secrets=secrets)
    return receipt


def render_text(receipt: CapabilityReceiptV1) -> str:
    """A human-readable block for `webslm admit` and the page."""
    outcome = receipt.outcome_code
    if receipt.failure_stage:
        outcome += f" (at stage {receipt.failure_stage})"
    features = ", ".join(receipt.enabled_feature_bits) or "none"
    model_hash = receipt.model_artifact_hash or "none"
    rows = [
        ("outcome", outcome),
        ("protocol", receipt.backend_protocol_version),
        ("day (UTC)", receipt.receipt_day),
        ("browser engine", receipt.browser_engine_major_bucket),
        ("operating system", receipt.operating_system_family_bucket),
        ("feature level", receipt.feature_level),
        ("fallback adapter", "yes" if receipt.fallback_adapter else "no"),
        ("features requested", features),
        ("limit profile", receipt.admitted_limit_profile_id),
        ("model layout", receipt.model_layout_profile),
        ("model sha256", f"{model_hash} (local only, not transmitted by default)"),
        ("runtime build", receipt.runtime_build_hash),
        ("shader bundle", receipt.shader_bundle_hash),
        ("self-test suite", receipt.self_test_suite_hash),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(["Capability receipt (v1)"] +
                     [f"  {name.ljust(width)}  {value}" for name, value in rows])


# -- hashes of our own code --------------------------------------------------------------------

def _sha256_lines(entries: Iterable[tuple[str, str]], domain: str) -> str:
    """sha256 of a domain tag and `name NUL value LF` lines, sorted by name."""
    digest = hashlib.sha256(domain.encode() + b"\0")
    for name, value in sorted(entries):
        digest.update(name.encode() + b"\0" + value.encode() + b"\n")
    return digest.hexdigest()


def runtime_build_hash(version: str | None = None, bundle_hash: str | None = None) -> str:
    """Names the runtime: the webslm version together with the shader bundle it runs."""
    if version is None:
        from .. import __version__ as version
    if bundle_hash is None:
        from .. import shader_bundle
        bundle_hash = shader_bundle.bundle_hash()
    return _sha256_lines([("webslm", version), ("shader-bundle", bundle_hash)], "webslm-runtime")


def self_test_suite_hash() -> str:
    """Names the golden suite admission runs: the sorted family names, the sha256 of the
    module that defines each family's test, and of the shared harness (golden.py with the
    comparison rules, runner.py with output poisoning). Editing any golden test, or a
    tolerance, changes it. The WGSL under test is named separately, by the bundle hash."""
    from .. import kernels  # noqa: F401  (importing the package registers every family)
    from ..kernels import golden, runner
    entries = [(f"family:{name}", _file_sha256(_defining_file(test)))
               for name, test in golden.FAMILIES.items()]
    entries += [(f"harness:{module.__name__.rsplit('.', 1)[-1]}", _file_sha256(module.__file__))
                for module in (golden, runner)]
    return _sha256_lines(entries, "webslm-golden-suite")


def _defining_file(function) -> str:
    function = inspect.unwrap(function)
    path = inspect.getsourcefile(function) or getattr(sys.modules.get(function.__module__),
                                                      "__file__", None)
    if not path:
        # A test we cannot name cannot be vouched for by a receipt.
        raise ValueError(f"cannot find the source file of golden test {function!r}")
    return path


def _file_sha256(path: str) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


# -- buckets -----------------------------------------------------------------------------------

_IOS = re.compile(r"\b(?:iPhone|iPad|iPod)\b|\b(?:CriOS|FxiOS|EdgiOS)/")
_FIREFOX = re.compile(r"\bFirefox/(\d{1,4})\b")
_CHROMIUM = re.compile(r"\b(?:HeadlessChrome|Chrome|Chromium)/(\d{1,4})\b")
_WEBKIT = re.compile(r"\bAppleWebKit/(\d{1,4})\b")


def browser_engine_bucket(user_agent: str | None) -> str:
    """The rendering engine and its major version in decades; never the UA itself."""
    if user_agent is None:
        return "native-wgpu"
    # Every browser on iOS is WebKit, whatever brand its UA names, so test that first.
    if not _IOS.search(user_agent):
        if match := _FIREFOX.search(user_agent):
            return f"firefox-{int(match[1]) // 10}x"
        if match := _CHROMIUM.search(user_agent):     # Chrome, Chromium, Edge, Opera, headless
            return f"chromium-{int(match[1]) // 10}x"
    if match := _WEBKIT.search(user_agent):
        # Safari and WebKitGTK froze this token at 605.1.15, so only its hundreds are kept.
        return f"webkit-{int(match[1]) // 100}xx"
    return "other"


def os_family_bucket(user_agent: str | None, native_platform: str | None = None) -> str:
    """One of OS_FAMILIES, from the UA in a browser and from sys.platform natively."""
    if user_agent is None:
        platform = native_platform or sys.platform
        for prefix, family in (("linux", "linux"), ("win", "windows"), ("darwin", "macos"),
                               ("android", "android"), ("ios", "ios")):
            if platform.startswith(prefix):
                return family
        return "other"
    # Order matters: iOS UAs say "like Mac OS X", Android UAs say "Linux", ChromeOS says "X11".
    for pattern, family in ((r"iPhone|iPad|iPod", "ios"), (r"Android", "android"),
                            (r"Windows", "windows"), (r"Macintosh|Mac OS X", "macos"),
                            (r"CrOS", "other"), (r"Linux|X11", "linux")):
        if re.search(pattern, user_agent):
            return family
    return "other"


def feature_names(features: Iterable[str]) -> tuple[str, ...]:
    """The requested features as a sorted tuple, each a standard WebGPU feature name."""
    names = set(features)
    unknown = sorted(names - set(WEBGPU_FEATURES))
    if unknown:
        raise ValueError(f"not standard WebGPU features, refused in a receipt: {unknown}")
    return tuple(sorted(names))


def _size_text(size: int) -> str:
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def limit_profile_id(limits: Mapping[str, int] | None) -> str:
    """E.g. "bind128M-wg16K-inv128"; "none" when no device was created."""
    if not limits:
        return "none"
    parts = []
    for name, prefix, steps in LIMIT_STEPS:
        if name not in limits:
            raise ValueError(f"device limits lack {name}")
        reached = [step for step in steps if step <= int(limits[name])]
        value = reached[-1] if reached else 0
        parts.append(prefix + (_size_text(value) if prefix != "inv" else str(value)))
    return "-".join(parts)


def model_layout_profile(tensors: Iterable) -> str:
    """The encodings present and the total tensor bytes rounded down to a power of two
    (at least 1M), e.g. "q4+q8+f32/64M"; "none" without a model. Tensors need `.encoding`
    and `.nbytes` (artifact.model.TensorInfo)."""
    encodings, total = set(), 0
    for tensor in tensors:
        if tensor.encoding not in MODEL_ENCODINGS:
            raise ValueError(f"unknown tensor encoding {tensor.encoding!r}")
        encodings.add(tensor.encoding)
        total += tensor.nbytes
    if not encodings:
        return "none"
    size = 1 << 20
    while size * 2 <= total:
        size *= 2
    return "+".join(e for e in MODEL_ENCODINGS if e in encodings) + "/" + _size_text(size)


def utc_day(now: datetime.datetime | datetime.date | None = None) -> str:
    """The UTC day of `now` as YYYY-MM-DD. A naive datetime is refused: its day is ambiguous."""
    if now is None:
        now = datetime.datetime.now(datetime.timezone.utc)
    if isinstance(now, datetime.datetime):
        if now.tzinfo is None:
            raise ValueError("receipt time must be timezone-aware (its UTC day is wanted)")
        now = now.astimezone(datetime.timezone.utc).date()
    return now.isoformat()


# -- the privacy check -------------------------------------------------------------------------

_HEX64 = re.compile(r"[0-9a-f]{64}")
_CODE = re.compile(r"[a-z][a-z0-9-]{0,39}")
_ENCODING = "(?:" + "|".join(MODEL_ENCODINGS) + ")"
_SHAPES = {
    "backend_protocol_version": re.compile(re.escape(BACKEND_PROTOCOL_VERSION)),
    "runtime_build_hash": _HEX64,
    "shader_bundle_hash": _HEX64,
    "self_test_suite_hash": _HEX64,
    "model_artifact_hash": _HEX64,
    "model_layout_profile": re.compile(rf"none|{_ENCODING}(?:\+{_ENCODING})*/\d+[MG]"),
    "browser_engine_major_bucket":
        re.compile(r"chromium-\d{1,3}x|firefox-\d{1,3}x|webkit-\d{1,2}xx|native-wgpu|other"),
    "operating_system_family_bucket": re.compile("|".join(OS_FAMILIES)),
    # "none": admission stopped before it had an adapter (the report lists only the two levels)
    "feature_level": re.compile("|".join(FEATURE_LEVELS + ("none",))),
    "admitted_limit_profile_id": re.compile(r"none|bind\d+[KMG]?-wg\d+[KMG]?-inv\d+"),
    "outcome_code": _CODE,
    "failure_stage": _CODE,
    "receipt_day": re.compile(r"\d{4}-\d{2}-\d{2}"),
}
_MAY_BE_NONE = {"model_artifact_hash", "failure_stage"}

# Key names that announce forbidden content, for a clearer message than "unknown field".
_FORBIDDEN_KEY = re.compile(r"prompt|text|token|description|vendor|architecture|driver|device_?id"
                            r"|time|frontier|probe|diagnostic|message|compiler|adapter_info",
                            re.IGNORECASE)
# A time of day: "14:05", or an ISO timestamp's "T14".
_TIME_OF_DAY = re.compile(r"\d{1,2}:\d{2}|\d{4}-\d{2}-\d{2}[T ]\d{2}")
# Words from vendor, architecture and driver strings; none can occur in a bucket or a hash.
# Matched as whole words (no letter either side), so "mali" does not fire inside "anomalies".
_VENDOR_WORD = re.compile(r"(?<![a-z])(?:nvidia|amd|radeon|intel|apple|qualcomm|adreno|mali|arm"
                          r"|imagination|powervr|mesa|llvm|llvmpipe|lavapipe|swiftshader|google"
                          r"|microsoft|warp|vulkan|d3d|metal|opengl|angle|driver)(?![a-z])",
                          re.IGNORECASE)


def check_privacy(receipt: Mapping[str, Any], secrets: Iterable[str] = ()) -> None:
    """Raise ReceiptPrivacyError unless `receipt` (a receipt's as_dict(), with or without its
    local-only fields) holds only the receipt's fields, each in its allow-listed shape.

    secrets: strings known to be private on this machine (the adapter's description, vendor
    and architecture); none may appear, in any case, as a whole token of any value."""
    # Matched as whole tokens (no letter or digit either side), so a short secret such as an
    # architecture name cannot fire inside an unrelated word or hash.
    secrets = [re.compile(rf"(?<![a-z0-9]){re.escape(s.strip().casefold())}(?![a-z0-9])")
               for s in secrets if s and len(s.strip()) >= 3]
    for key in receipt:
        if key not in RECEIPT_FIELDS:
            kind = "a forbidden" if _FORBIDDEN_KEY.search(str(key)) else "an unknown"
            raise ReceiptPrivacyError("receipt-unknown-field", str(key),
                                      f"{kind} field {key!r} is not part of CapabilityReceiptV1")
    for key in RECEIPT_FIELDS:
        if key not in receipt and key not in LOCAL_ONLY_FIELDS:
            raise ReceiptPrivacyError("receipt-missing-field", key, f"the field {key!r} is missing")
    for key, value in receipt.items():
        for text in _strings_of(key, value):
            _check_text(key, text, secrets)
        _check_shape(key, value)
    if (receipt["outcome_code"] == OUTCOME_ADMITTED) != (receipt["failure_stage"] is None):
        raise ReceiptPrivacyError("receipt-bad-value", "failure_stage",
                                  "a failure names its stage and an admission names none")


def _strings_of(key: str, value: Any) -> list[str]:
    """The strings inside one field's value; any number (a token id, a raw limit, a byte
    count, a time) is refused: no receipt field is numeric."""
    if value is None or isinstance(value, bool):
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in _strings_of(key, item)]
    raise ReceiptPrivacyError("receipt-number" if isinstance(value, (int, float)) else
                              "receipt-bad-value", key,
                              f"{type(value).__name__} values are not allowed in a receipt")


def _check_text(key: str, text: str, secrets: list[re.Pattern]) -> None:
    folded = text.casefold()
    if any(secret.search(folded) for secret in secrets):
        raise ReceiptPrivacyError("receipt-secret", key,
                                  "the value contains a private string of this machine")
    if _TIME_OF_DAY.search(text):
        raise ReceiptPrivacyError("receipt-time-of-day", key,
                                  "the value looks like a time of day; receipts keep the day only")
    if not _HEX64.fullmatch(text) and _VENDOR_WORD.search(text):
        raise ReceiptPrivacyError("receipt-vendor-string", key,
                                  "the value looks like a vendor, device or driver string")


def _check_shape(key: str, value: Any) -> None:
    if value is None and key in _MAY_BE_NONE:
        return
    if key == "fallback_adapter":
        ok = isinstance(value, bool)
    elif key == "enabled_feature_bits":
        ok = (isinstance(value, (list, tuple)) and all(v in WEBGPU_FEATURES for v in value)
              and list(value) == sorted(set(value)))
    else:
        ok = isinstance(value, str) and bool(_SHAPES[key].fullmatch(value))
    if ok and key == "receipt_day":
        try:
            datetime.date.fromisoformat(value)
        except ValueError:
            ok = False
    if not ok:
        raise ReceiptPrivacyError("receipt-bad-value", key,
                                  f"{value!r} is not an allowed value for {key}")
