#!/usr/bin/env bash
# The GPU items of the issues (uqreg's CUDA equality test, engine GFLOP/s and paper-e1 sweep;
# the vision reproductions at `cpu` scale with CUDA), as one prepared script for the device
# tool: a session is lent about 15 minutes of device time, so each item runs under its own
# time budget, and a reproduction cut by its budget still reports how far it got (every driver
# resumes, so a second call continues where the first stopped).
#
# Run on the device machine, at the repository root, after benchmarks/device/fetch_wheels.sh here:
#     run(command="bash benchmarks/device/gpu_items.sh", carry=[".whl"], timeout_s=590)
# Items and budgets (seconds) are chosen with ITEMS, e.g. ITEMS="cuda_test:60 pitfalls:400".
# DEVICE=cpu runs the same items on the CPU (the script's own check, on tiny budgets).
# Writes $OUT/summary.txt (one line per item: exit status, wall time, progress) and
# $OUT/logs.txt (the end of each item's log); work files stay in $WORK.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/gpu_items_out}"
WORK="${WORK:-/tmp/gpu_items_work}"
DEVICE="${DEVICE:-cuda}"
PY="${PYTHON:-python3}"
ITEMS="${ITEMS:-env:20 cuda_test:90 bench:100 paper_e1:150 pitfalls:60 uimnet:60 url:60}"
mkdir -p "$OUT" "$WORK"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" .whl/*.whl || exit 1
    SITE="$WORK/site:"
else
    SITE=""
fi
export PYTHONPATH="${SITE}$PWD/shared/src:$PWD/packages/uqreg/src:$PWD/packages/uqvision/src"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg

count() {  # files named $2 under $1
    find "$1" -name "$2" 2>/dev/null | wc -l
}

progress() {  # what an item left on disk
    case "$1" in
        paper_e1) echo "cells $(count "$WORK/e1/cells" '*.nc') of $("$PY" -c \
            'from uqreg.presets import PRESETS; from uqreg.sweep import plan_cells
print(len(plan_cells(PRESETS.lookup("paper-e1").config)))')" ;;
        pitfalls) echo "checkpoints $(count "$WORK/pitfalls/models" '*.safetensors')," \
                       "caches $(count "$WORK/pitfalls/caches" '*.nc')" ;;
        uimnet) echo "checkpoints $(count "$WORK/uimnet/checkpoints" '*.safetensors')," \
                     "caches $(count "$WORK/uimnet/caches" '*.nc')" ;;
        url) echo "checkpoints $(count "$WORK/url" '*.safetensors')" ;;
        *) echo "-" ;;
    esac
}

run_item() {  # name budget
    local name="$1" budget="$2" start rc
    start=$(date +%s%N)
    case "$name" in
        env)
            { nvidia-smi || true; "$PY" -c 'import sys, torch, timm, xarray, netCDF4, dask
print(sys.version); print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "timm", timm.__version__, "xarray", xarray.__version__, "dask", dask.__version__)'; } ;;
        cuda_test)  # the float32 CUDA study equals the CPU one (uqreg tests, marker cuda)
            (cd packages/uqreg && timeout "$budget" "$PY" -m pytest tests/test_sweep.py -m cuda \
                -q -p no:cacheprovider -rs) ;;
        bench)  # engine GFLOP/s and fraction of the GEMM roofline on one 6,000-network cell
            timeout "$budget" "$PY" packages/uqreg/benchmarks/bench_engine.py --device "$DEVICE" \
                --loop-members 4 --epochs 20 --repeats 2 --no-profile ;;
        paper_e1)  # the paper's E.1 study (goal: under 10 minutes on one H100)
            timeout "$budget" "$PY" -m uqreg.cli sweep --preset paper-e1 --device "$DEVICE" \
                --workers 1 --out "$WORK/e1" --no-plots --quiet ;;
        pitfalls)
            timeout "$budget" "$PY" -m uqvision --threads 4 reproduce pitfalls --scale cpu \
                --out "$WORK/pitfalls" --device "$DEVICE" ;;
        uimnet)
            timeout "$budget" "$PY" -m uqvision --threads 4 reproduce uimnet --scale cpu \
                --out "$WORK/uimnet" --device "$DEVICE" ;;
        url)
            timeout "$budget" "$PY" -m uqvision --threads 4 reproduce url --scale cpu \
                --out "$WORK/url" --device "$DEVICE" ;;
        *) echo "unknown item $name"; return 2 ;;
    esac > "$WORK/$name.log" 2>&1
    rc=$?
    printf '%-10s exit %3d  wall %6d ms  budget %4d s  device %s  %s\n' "$name" "$rc" \
        $(( ($(date +%s%N) - start) / 1000000 )) "$budget" "$DEVICE" "$(progress "$name")" \
        | tee -a "$OUT/summary.txt"
    { echo "== $name (exit $rc)"; tail -n 25 "$WORK/$name.log"; } >> "$OUT/logs.txt"
}

for item in $ITEMS; do
    run_item "${item%%:*}" "${item##*:}"
done
