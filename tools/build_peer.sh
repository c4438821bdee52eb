#!/usr/bin/env bash
# Build the llama.cpp peer for bench/cpu.py and tests/test_tokenizer_llama_cpp.py (tokenizer parity):
# a separate venv with llama-cpp-python built from source.
#
# Usage: tools/build_peer.sh [--force]
#   env: PEER_VENV    (default REPO/.venv-peer)
#        PEER_PYTHON  (default: the interpreter REPO/.venv was made from, else python3.11)
#        CMAKE_ARGS   (default "-DGGML_NATIVE=ON": tuned to THIS machine's CPU; numbers from a
#                      native build are not portable across CPUs)
#        JOBS         (default: nproc) parallel compile jobs
#
# Reproducible: llama-cpp-python==0.3.36 from the cached sdist (sha256-pinned below; fetched from
# PyPI only when the cache lacks it), the build backend and runtime deps pinned, and the build run
# without build isolation so nothing unpinned enters it. Takes ~10-20 min on 2 cores.
# Note: .venv-peer/ is NOT covered by .gitignore (".venv/" does not match it): don't commit it.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PEER_VENV:-$REPO/.venv-peer}"
SDIST="$REPO/.assets/cache/llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON}"
export CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-$(nproc)}"

if [[ -z "${PEER_PYTHON:-}" ]]; then
  if [[ -f "$REPO/.venv/pyvenv.cfg" ]]; then
    PEER_PYTHON="$(sed -n 's/^executable = //p' "$REPO/.venv/pyvenv.cfg")"
  fi
  PEER_PYTHON="${PEER_PYTHON:-python3.11}"
fi

if [[ "${1:-}" == "--force" ]]; then rm -rf "$VENV"; fi
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c 'import llama_cpp, sys; sys.exit(llama_cpp.__version__ != "0.3.36")' 2>/dev/null; then
  echo "build_peer: $VENV already has llama-cpp-python 0.3.36 (use --force to rebuild)"
  exit 0
fi

mkdir -p "$(dirname "$SDIST")"
if [[ ! -f "$SDIST" ]]; then
  echo "build_peer: sdist not cached; downloading llama-cpp-python==0.3.36 from PyPI"
  python3 -m pip download --no-deps --no-binary :all: -d "$(dirname "$SDIST")" llama-cpp-python==0.3.36
fi
echo "$SDIST_SHA256  $SDIST" | sha256sum -c --quiet - || { echo "build_peer: sha256 mismatch for $SDIST" >&2; exit 2; }

echo "build_peer: python=$PEER_PYTHON venv=$VENV CMAKE_ARGS=$CMAKE_ARGS jobs=$CMAKE_BUILD_PARALLEL_LEVEL"
"$PEER_PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# Build backend + runtime deps, pinned (numpy matches the project's .venv).
"${PIP[@]}" install \
  "scikit-build-core==1.1.2" "packaging==26.4" "pathspec==1.1.1" \
  "numpy==2.4.6" "typing-extensions==4.16.0" "diskcache==5.6.3" "jinja2==3.1.6" "MarkupSafe==3.0.4"
start=$(date +%s)
"${PIP[@]}" install -v --no-build-isolation --no-deps --no-cache-dir "$SDIST"
echo "build_peer: built in $(( $(date +%s) - start )) s"
"$VENV/bin/python" -c 'import llama_cpp; print("build_peer: ok, llama_cpp", llama_cpp.__version__); print(llama_cpp.llama_print_system_info().decode())'
