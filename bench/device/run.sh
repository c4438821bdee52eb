#!/usr/bin/env bash
# One device call's measurements, on the lent GPU machine (after bench/device/prepare.sh here).
#
#   bash bench/device/run.sh [SUITE ...]     (default: replay rope)
#
# Suites, each writing one JSON to $OUT (at most 8 files come back):
#   replay   bench/native_replay.py on SmolLM2's shape, then bench/engine.py on it with the C
#            replay loop and with WEBSLM_NATIVE_REPLAY=off, side by side
#   rope     bench/engine.py --fusions default against default,rope-kv-into-matmul on the
#            SmolLM2 and Llama-3.1-8B shapes (--profile)
#   qout     bench/engine.py --fusions default against default,-quantize-into-matmul (8B)
# Synthetic models are written on the device (bench/synthetic_model.py; the 8B is ~4.5 GB).
# LOCAL=1 runs the same on this machine's adapter (lavapipe) with a tiny shape, to check the
# script before spending device time; LIMIT (seconds, default 300) bounds each benchmark.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
LIMIT=${LIMIT:-300}
suites=("$@")
[ ${#suites[@]} -eq 0 ] && suites=(replay rope)

if [ -z "${LOCAL:-}" ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  python3 -m pip install -q --no-index --find-links .whl wgpu==0.32.0 2>&1 | tail -1
  PY=python3
  small=smollm2 big=llama8b tokens=64
else
  PY=.venv/bin/python
  small=stacked big=stacked tokens=8
fi
export PYTHONPATH=$PWD/py WEBSLM_TUNING_CACHE=off
models=/tmp/device-models
mkdir -p "$models"

model() {                                     # the synthetic model of shape $1, written once
  [ -f "$models/$1.slm" ] || "$PY" bench/synthetic_model.py --shape "$1" --out "$models/$1.slm" > /dev/null
  echo "$models/$1.slm"
}

engine() {                                    # engine NAME ARGS...: one bench/engine.py run into $OUT/NAME.json
  local name=$1; shift
  echo "== $name: $*"
  timeout "$LIMIT" "$PY" bench/engine.py --new-tokens "$tokens" --repeats 2 --out "$OUT/$name.json" "$@" 2>&1 \
    | grep -E "tok/s|tuning:|Error|error:" | grep -v XDG_RUNTIME_DIR
}

"$PY" -c "import wgpu; print(wgpu.gpu.request_adapter_sync().summary)"
for suite in "${suites[@]}"; do
  case "$suite" in
    replay)
      timeout "$LIMIT" "$PY" bench/native_replay.py --model "$(model "$small")" --out "$OUT/native_replay.json" \
        2>&1 | grep -v XDG_RUNTIME_DIR | tail -3
      engine engine_replay_c --model "$(model "$small")"
      WEBSLM_NATIVE_REPLAY=off engine engine_replay_python --model "$(model "$small")"
      ;;
    rope)
      engine engine_rope_default --model "$(model "$small")" --model "$(model "$big")" --profile --fusions default
      engine engine_rope_fused --model "$(model "$small")" --model "$(model "$big")" --profile \
        --fusions default,rope-kv-into-matmul
      ;;
    qout)
      engine engine_qout_off --model "$(model "$big")" --fusions default,-quantize-into-matmul
      ;;
    *)
      echo "unknown suite $suite (replay, rope, qout)" >&2
      exit 64
      ;;
  esac
done
ls -la "$OUT"
