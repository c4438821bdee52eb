#!/usr/bin/env bash
# Fetch, on this machine, what a device run needs and the lent GPU machine cannot download
# (nothing outside it can be reached from it): the Vulkan loader as amd64 Debian packages in
# .gl/, and wgpu-native's Python wheels for the device's CPython 3.12 in .whl/. Then build the
# native replay loop (tools/build_kernels.py) so that it travels too. Idempotent.
#
#   bash bench/device/prepare.sh
#
# Then one `run` of the device tool, carrying [".gl", ".whl", "py/webslm/webgpu/build"]:
#   bash bench/device/run.sh [SUITE ...]          (bench/device/run.sh says what each suite times)
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! ls .gl/libvulkan1_*.deb > /dev/null 2>&1; then
  mkdir -p .gl /tmp/amd64/partial
  apt_amd64=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
  apt-get "${apt_amd64[@]}" update -qq
  (cd .gl && apt-get "${apt_amd64[@]}" download libvulkan1)
fi
if ! ls .whl/wgpu-0.32.0-*.whl > /dev/null 2>&1; then
  mkdir -p .whl
  .venv/bin/python -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whl wgpu==0.32.0 cffi pycparser rendercanvas
fi
.venv/bin/python tools/build_kernels.py
ls -la .gl .whl py/webslm/webgpu/build
