"""Shared fixtures: a native WebGPU device on wgpu-native (lavapipe on CI machines)."""
import asyncio
import copy
import pathlib

import pytest


def _native_adapter_or_reason():
    try:
        from webslm.webgpu.native import NativeGpu
    except ImportError as exc:
        return None, f"PyPI wgpu is not installed ({exc}); install the [gpu] extra"
    adapter = asyncio.run(NativeGpu().request_adapter("core"))
    if adapter is None:
        return None, "wgpu-native found no adapter (apt-get install mesa-vulkan-drivers gives lavapipe)"
    return adapter, None


@pytest.fixture(scope="session")
def native_gpu():
    adapter, reason = _native_adapter_or_reason()
    if adapter is None:
        pytest.skip(reason)
    from webslm.webgpu.native import NativeGpu
    return NativeGpu()


@pytest.fixture
def run():
    """Run a coroutine to completion (tests are plain functions; the GPU API is async)."""
    return asyncio.run


@pytest.fixture(scope="session")
def fixture_slm_path(tmp_path_factory):
    """The tiny deterministic fixture model (webslm.fixture), written once per session."""
    from webslm.fixture import make_fixture
    path = tmp_path_factory.mktemp("fixture") / "fixture.slm"
    make_fixture(path)
    return path


@pytest.fixture(scope="session")
def fixture_slm(fixture_slm_path) -> bytes:
    return fixture_slm_path.read_bytes()


@pytest.fixture(scope="session")
def native_device(native_gpu):
    """One native device for the session, with every optional feature the adapter offers
    among those kernels use, so that every kernel variant (tiers A, B and C) can run."""
    import asyncio
    adapter = asyncio.run(native_gpu.request_adapter("core"))
    from webslm.kernels.registry import KERNEL_FEATURES
    features = sorted(KERNEL_FEATURES & adapter.features)
    device = asyncio.run(adapter.request_device(features=features))
    yield device
    device.destroy()


@pytest.fixture(scope="session")
def gpu_slm_path(tmp_path_factory):
    """A tiny model the GPU forward pass can run (bench/synthetic_model.py --shape tiny:
    random weights, q4/q8 like SmolLM2, f32 norms, no biases). The fixture model has q/k/v
    biases and f16 norms, which admission refuses for the GPU (admission/pipelines.unsupported)."""
    return synthetic_slm(tmp_path_factory, "tiny")


@pytest.fixture(scope="session")
def stacked_slm_path(tmp_path_factory):
    """The smallest synthetic model the planner stacks (--shape stacked): the fused decode step."""
    return synthetic_slm(tmp_path_factory, "stacked")


@pytest.fixture(scope="session")
def wide_heads_slm_path(tmp_path_factory):
    """A small model with Gemma 3's head_dim 256 (--shape wide_heads)."""
    return synthetic_slm(tmp_path_factory, "wide_heads")


@pytest.fixture(scope="session")
def qwen2_slm_path(tmp_path_factory):
    """The stacked shape with Qwen2's q/k/v biases (--shape qwen2). A fixture, not an import of
    synthetic_slm: `pytest tests tests_browser` resolves `conftest` to tests_browser's."""
    return synthetic_slm(tmp_path_factory, "qwen2")


SMOLLM2_GGUF = pathlib.Path(__file__).resolve().parents[1] / ".assets" / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_gguf_hf_tokenizer():
    """transformers' tokenizer built from the SmolLM2 GGUF (an oracle of tests/test_chat_template.py
    and tests/test_tokenizer.py), once a session: building it from the GGUF takes seconds."""
    pytest.importorskip("torch", reason="transformers' GGUF reader needs torch")
    transformers = pytest.importorskip("transformers")
    if not SMOLLM2_GGUF.exists():
        pytest.skip(f"{SMOLLM2_GGUF} is missing (run set-up)")
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return transformers.AutoTokenizer.from_pretrained(str(SMOLLM2_GGUF.parent), gguf_file=SMOLLM2_GGUF.name)


GEMMA3_270M_GGUF = pathlib.Path(__file__).resolve().parents[1] / ".assets" / "cache" / "gemma-3-270m-q4_k_m.gguf"


@pytest.fixture(scope="session")
def gemma3_270m_slm_path(tmp_path_factory):
    """`webslm convert gemma-3-270m-q4_k_m.gguf -o g.slm` (lossless: every tensor as stored),
    through the CLI, once a session: tests/test_gemma3_gguf.py checks the conversion and the CPU
    path on it, tests/test_gpu_gemma3_native.py the GPU (each conversion takes ~20 s). Skips
    without the GGUF (`python tools/test_data.py gemma3` fetches it)."""
    if not GEMMA3_270M_GGUF.is_file():
        pytest.skip(f"{GEMMA3_270M_GGUF.name} is not in {GEMMA3_270M_GGUF.parent} "
                    "(python tools/test_data.py gemma3 fetches it)")
    pytest.importorskip("gguf")
    from webslm.cli import main
    out = tmp_path_factory.mktemp("gemma3") / "g.slm"
    assert main(["convert", str(GEMMA3_270M_GGUF), "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def q4k_m_slm_path(tmp_path_factory):
    """llama.cpp's Q4_K_M mix on the small k-quant shape (--shape kquant --encoding q4k_m):
    q4k layers, q6k in some, q, k and v not stacked."""
    return synthetic_slm(tmp_path_factory, "kquant", scheme="q4k_m")


def synthetic_slm(tmp_path_factory, shape: str, **options):
    """bench/synthetic_model.py's artifact of `shape`, written once into a temporary folder
    (`options`: write_synthetic's, e.g. scheme)."""
    import importlib.util
    import pathlib
    script = pathlib.Path(__file__).resolve().parents[1] / "bench" / "synthetic_model.py"
    spec = importlib.util.spec_from_file_location("synthetic_model", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path_factory.mktemp(f"{shape}_model") / f"{shape}.slm"
    module.write_synthetic(path, shape, **options)
    return path


_SELF_TEST_REPORTS: dict = {}    # (features, limits, size, seed) -> admission's self-test report


@pytest.fixture
def self_test_once(monkeypatch):
    """Admission's kernel self-test (golden.run_all, size "quick": 400+ cases, ~90% of a
    native admission's time) run once per device kind in the session; later admissions in the
    tests that ask for this fixture replay that report. The cases are seeded and lavapipe is
    deterministic, so a second run on another device of the same features and limits computes
    the same report: for tests whose subject is not the self-test (device loss, cancels,
    fusion rules, the executor against the oracle) it is pure cost. Admission itself (device,
    allocation, compilation, error scopes) still runs in full. Never replayed: a device with
    faults armed (the self-test-mismatch fault corrupts a readback), a self-test with a model
    or a family subset, and tests without this fixture (tests/test_admission.py among them)."""
    from webslm.admission.tracked import Faults
    from webslm.kernels import golden
    run_all = golden.run_all

    async def once(device, size="full", model=None, seed=0, families=None, on_family=None, kernels=None,
                   compiled=None, positions=None):
        if model is not None or families is not None or getattr(device, "faults", Faults()) != Faults():
            return await run_all(device, size, model=model, seed=seed, families=families, on_family=on_family,
                                 kernels=kernels, compiled=compiled, positions=positions)
        # admission tests the plan's pipelines, up to its KV capacity
        key = (tuple(sorted(device.features)), tuple(sorted(dict(device.limits).items())), size, seed,
               None if kernels is None else tuple(sorted(kernels)),
               None if compiled is None else tuple(sorted(compiled)), positions)
        if key not in _SELF_TEST_REPORTS:
            _SELF_TEST_REPORTS[key] = await run_all(device, size, seed=seed, on_family=on_family, kernels=kernels,
                                                    compiled=compiled, positions=positions)
        elif on_family is not None:                       # the progress events of a real run
            total = len(_SELF_TEST_REPORTS[key]["families"])
            for done in range(1, total + 1):
                on_family(done, total)
        return copy.deepcopy(_SELF_TEST_REPORTS[key])

    monkeypatch.setattr(golden, "run_all", once)


@pytest.fixture(scope="module")
def measured(native_gpu, model):
    """One forced tuning run of the module's `model` (tests/tuning_models.forced_tuning): the
    tuning tests' (test_tuning.py, test_tune_later.py) report and compiled kernel keys."""
    from tuning_models import forced_tuning
    return forced_tuning(native_gpu, model)
