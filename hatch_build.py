"""Wheel build hook: records the shader bundle hash inside the wheel.

The hash is computed by webslm.shader_bundle (stdlib only, loaded here by file path so the
build does not import the package or numpy) and written as webslm/shaders/BUNDLE.json.
At run time webslm recomputes the hash from the WGSL files it carries and refuses to run
if the two differ, so a wheel whose shaders were edited after the build is caught.
"""
import importlib.util
import json
import pathlib
import sys
import tempfile

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ROOT = pathlib.Path(__file__).parent


def _load_shader_bundle_module():
    spec = importlib.util.spec_from_file_location(
        "_webslm_shader_bundle", ROOT / "py" / "webslm" / "shader_bundle.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while executing
    spec.loader.exec_module(module)
    return module


class ShaderBundleHook(BuildHookInterface):
    def initialize(self, version, build_data):
        if self.target_name != "wheel" or version == "editable":
            return  # an editable install reads the checkout's shaders/ directly
        bundle = _load_shader_bundle_module().read_bundle(ROOT / "shaders")
        record = {"bundle_hash": bundle.bundle_hash, "files": bundle.file_hashes}
        out = pathlib.Path(tempfile.mkdtemp()) / "BUNDLE.json"
        out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        build_data["force_include"][str(out)] = "webslm/shaders/BUNDLE.json"
