#!/usr/bin/env bash
# Every CUDA path of the project, checked and timed in one script of at most 8 minutes on one GPU:
# the first thing to run on a GPU machine (docs/gpu.md holds its last output).
#
#   bash benchmarks/gpu_check.sh                 # default items: budgets of 480 s in all
#   ITEMS="env:20 predict:120" bash benchmarks/gpu_check.sh
#
# Default items (name:budget in seconds; each runs under `timeout` and reports how far it got):
#   env           nvidia-smi and the versions of torch, timm, xarray, dask
#   uqreg_cuda    uqreg's float64 study on CUDA equals the CPU one (relative 1e-6); the measured engine plan:
#                 two CUDA runs bit-identical, CUDA streams = one chunk after another; CUDA graphs
#                 give the bits of eager epochs, alone and on concurrent streams (marker cuda)
#   uqreg_engine  the batched engine on CUDA against torch.func.vmap and the per-network loop, and
#                 the paper-e1 cell under the measured plan beside fixed chunks of 64 and beside
#                 its CUDA-graph replays and the step of backend triton, one Triton kernel per step
#                 at TRITON_WARPS warps per program (default 8) and TRITON_PRECISIONS (default
#                 ieee, exact float32; tf32x3 timed, not taken; bench_engine.py: RESULT
#                 speedup_vs_loop, speedup_vs_vmap, roofline fractions, graphs_vs_eager,
#                 triton_vs_eager); where one epoch of a chunk goes (GEMMs, Adam, other kernels,
#                 device idle; DETAIL profile_..., fraction_bound_gemm_adam)
#   predict       uqvision predict against the plain timm loop on CUDA, fp32, bf16 autocast and
#                 channels_last (bench_predict.py --device cuda)
#   predict_decode  uqvision predict --decoder torchvision (nvJPEG in batches, resize/crop on the
#                 GPU) against timm's plain loop (Pillow on the CPU workers) and the same loop
#                 decoding on the GPU; the two decoders' logit difference and top-1 agreement
#                 (bench_predict.py --decoder torchvision); nvJPEG reproducible (test -k nvjpeg)
#   detectors     uqmetrics' Mahalanobis, KNN and ViM on CUDA (backend torch:cuda) against
#                 pytorch-ood 0.4, fit + score, 20,000 x 512 (bench_detectors.py: RESULT
#                 <detector>_vs_pytorch_ood); KNN's CUDA search bit-identical to faiss, Mahalanobis
#                 and ViM on CUDA within float32 rounding of numpy, same ranking, bit-identical run
#                 to run (test_detectors_knn_backends.py, test_detectors_torch_backends.py -k cuda)
#   sweep         a sweep of 8 models sharing one preprocessing against 8 separate predict runs,
#                 each image decoded once per group (bench_sweep.py: zoo_vs_separate, per_cell_fixed_s,
#                 decodes_per_image); first, decoded batches made on CUDA equal the CPU's
#                 (test_sweep_decode.py -k cuda)
#   vision_cuda   one training epoch, a one-process torchrun (train and predict), and the
#                 bit-identity claims on CUDA: batch size, CUDA vs CPU, MC-dropout masks
#                 (benchmarks/device/cuda_checks.py)
# Optional items (longer; each driver resumes, so a cut item continues on the next call):
#   uqreg_triton (uqreg's Triton step kernel on CUDA: the fused backend's step within float32
#   rounding, a network's bits independent of its chunk, two runs bit-identical, the steps it does
#   not cover bit for bit the fused ones: tests/test_triton_step.py; up to 120 s with the kernel's
#   builds),
#   multi_gpu (2+ GPUs: bench_sweep's 8 models swept on 1 GPU and on one Dask worker per GPU,
#   --gpus; RESULT multi_gpu_speedup, caches bit-identical; one SKIP line on one GPU; ~120 s),
#   detectors_large (the detectors item at 200,000 x 2048, 1,000 classes, one round: RESULT
#   <detector>_vs_pytorch_ood_large; about 120 s, most of it pytorch-ood's KNN, scikit-learn's
#   brute-force search on 2 CPU threads),
#   sweep_large (the sweep item at 5,000 images on CUDA: zoo_vs_separate and per_cell_fixed_s
#   where fixed costs no longer dominate, then where a cell's time per image goes: bench_sweep.py
#   --profile 512, RESULT profile_gpu_busy_fraction; about 200 s),
#   paper_e1 (uqreg sweep --preset paper-e1, whole, measured plan, --cuda-graphs unless
#   CUDA_GRAPHS=0, --backend E1_BACKEND (default fused); RESULT paper_e1_wall_s; then sweep_profile.py over its cells), pitfalls, uimnet, url (uqvision reproduce NAME
#   --scale cpu --device cuda).
#
# Without CUDA it says so and exits 0; DEVICE=cpu runs the same items on the CPU (the script's
# own check). Packages come from the source tree (PYTHONPATH); the wheels the device image lacks
# (netCDF4, dask, ...) are installed from .whl/ when present (benchmarks/device/fetch_wheels.sh).
# On the project's device tool: run(command="bash benchmarks/gpu_check.sh", carry=[".whl"]).
# Writes $OUT/summary.txt (one line per item: exit status, wall time, progress), $OUT/results.txt
# (every RESULT line) and $OUT/logs.txt (the end of each item's log); work files stay in $WORK.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check_out}"
WORK="${WORK:-/tmp/gpu_check_work}"
DEVICE="${DEVICE:-cuda}"
CUDA_GRAPHS="${CUDA_GRAPHS:-1}"  # paper_e1 with --cuda-graphs (0: eager epochs)
# paper_e1's Dask workers on the one GPU (1, as on the H200; 2 or more overlap cells whose small
# networks leave the GPU idle between kernel launches: the dropout methods' 50 networks)
E1_WORKERS="${E1_WORKERS:-1}"
# paper_e1's training backend: fused, or triton (the ensembles' step as one Triton kernel; its
# cells are other results than fused's, so the run starts its own cells in $WORK/e1_triton)
E1_BACKEND="${E1_BACKEND:-fused}"
E1_OUT="$WORK/e1$([ "$E1_BACKEND" = fused ] || echo "_$E1_BACKEND")"
# warps per program, and the products' precisions, at which uqreg_engine times the Triton kernel
TRITON_WARPS="${TRITON_WARPS:-8}"
TRITON_PRECISIONS="${TRITON_PRECISIONS:-ieee}"
PY="${PYTHON:-python3}"
ITEMS="${ITEMS:-env:10 uqreg_cuda:40 uqreg_engine:55 predict:90 predict_decode:60 detectors:45 sweep:80 vision_cuda:100}"
mkdir -p "$OUT" "$WORK"
if [ "$DEVICE" != cpu ] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "gpu_check: no CUDA device here; nothing to check (DEVICE=cpu runs the items on the CPU)"
    exit 0
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$WORK/site" .whl/*.whl || exit 1
    SITE="$WORK/site:"
else
    SITE=""
fi
export PYTHONPATH="${SITE}$PWD/shared/src:$PWD/packages/uqreg/src:$PWD/packages/uqvision/src"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
# the engine's measured plans (uqreg.engine.autoplan) are recorded here and kept in $OUT
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$WORK/cache}"

count() {  # files named $2 under $1
    find "$1" -name "$2" 2>/dev/null | wc -l
}

progress() {  # what an item left on disk
    case "$1" in
        paper_e1) echo "cells $(count "$E1_OUT/cells" '*.nc') of $("$PY" -c \
            'from uqreg.presets import PRESETS; from uqreg.sweep import plan_cells
print(len(plan_cells(PRESETS.lookup("paper-e1").config, chunk_repetitions=50)))')" ;;
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
try:
    import triton; tv = triton.__version__
except ImportError:
    tv = "missing"
print(sys.version); print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "timm", timm.__version__, "xarray", xarray.__version__, "dask", dask.__version__, "triton", tv)'; } ;;
        uqreg_cuda)  # the float64 CUDA study equals the CPU one (uqreg tests, marker cuda)
            (cd packages/uqreg && timeout "$budget" "$PY" -m pytest tests/test_sweep.py \
                tests/test_autoplan.py tests/test_fused.py -m cuda -q -p no:cacheprovider -rs) ;;
        uqreg_engine)  # against vmap and the loop; GFLOP/s, fraction of the GEMM roofline
            timeout "$budget" "$PY" packages/uqreg/benchmarks/bench_engine.py --device "$DEVICE" \
                --loop-members 4 --epochs 20 --repeats 2 --no-profile --max-memory 64 --cuda-graphs \
                --triton --triton-warps "$TRITON_WARPS" --triton-precisions "$TRITON_PRECISIONS" ;;
        uqreg_triton)  # the Triton step kernel on CUDA against the fused ops; bits (uqreg tests)
            (cd packages/uqreg && timeout "$budget" "$PY" -m pytest tests/test_triton_step.py \
                -q -p no:cacheprovider -rs) ;;
        predict)
            timeout "$budget" "$PY" packages/uqvision/benchmarks/bench_predict.py \
                --device "$DEVICE" --rounds 2 --images 1024 --mc-images 64 --batch-size 64 ;;
        predict_decode)  # the GPU decoder: speed, logits against Pillow's, reproducible
            { (cd packages/uqvision && timeout 20 "$PY" -m pytest tests/test_predict_decoder.py \
                -q -p no:cacheprovider -rs -k "nvjpeg or identity"); \
              timeout "$((budget - 20))" "$PY" packages/uqvision/benchmarks/bench_predict.py \
                --device "$DEVICE" --decoder torchvision --rounds 2 --batch-size 64 \
                --images $([ "$DEVICE" = cpu ] && echo 64 || echo 1024) \
                --work "$WORK/predict_decode"; } ;;
        detectors)  # OOD detectors against pytorch-ood 0.4, ours on CUDA; the CUDA tests first
            { (cd packages/uqvision && timeout 15 "$PY" -m pytest \
                tests/test_detectors_knn_backends.py tests/test_detectors_torch_backends.py \
                -q -p no:cacheprovider -rs -k cuda); \
              timeout "$((budget - 15))" "$PY" packages/uqvision/benchmarks/bench_detectors.py \
                --device "$DEVICE" --sizes small --rounds 2; } ;;
        multi_gpu)  # one GPU against one Dask worker per GPU (--gpus); SKIP below 2 GPUs
            { (cd shared && timeout 40 "$PY" -m pytest tests/test_sweep_gpus.py -q \
                -p no:cacheprovider -rs -k "spread or pins"); \
              timeout "$((budget - 40))" "$PY" packages/uqvision/benchmarks/bench_multi_gpu.py \
                --device "$DEVICE" --rounds 1 --work "$WORK/multi_gpu" \
                --images $([ "$DEVICE" = cpu ] && echo 64 || echo 2000); } ;;
        detectors_large)  # the same at 200,000 x 2048 (optional; ITEMS="detectors_large:180")
            timeout "$budget" "$PY" packages/uqvision/benchmarks/bench_detectors.py \
                --device "$DEVICE" --sizes large --rounds 1 ;;
        sweep|sweep_large)  # zoo_vs_separate, decodes/image, per_cell_fixed_s; sweep: CUDA batches = CPU's
            { [ "$name" != sweep ] || (cd packages/uqvision && timeout 40 "$PY" -m pytest \
                tests/test_sweep_decode.py -k cuda -q -p no:cacheprovider -rs); \
              timeout "$([ "$name" = sweep ] && echo $((budget - 40)) || echo "$budget")" \
                "$PY" packages/uqvision/benchmarks/bench_sweep.py \
                --device "$DEVICE" --rounds 1 --work "$WORK/$name" \
                --images $([ "$DEVICE" = cpu ] && echo 64 || { [ "$name" = sweep ] \
                    && echo 512 || echo 5000; }) \
                $([ "$name" = sweep_large ] \
                    && echo "--profile $([ "$DEVICE" = cpu ] && echo 64 || echo 512)"); } ;;
        vision_cuda)
            timeout "$budget" "$PY" benchmarks/device/cuda_checks.py --device "$DEVICE" \
                --work "$WORK/vision_cuda" $([ "$DEVICE" = cpu ] && echo "--images 64 \
                --arch test_resnet --image-size 64") ;;
        paper_e1)  # the paper's E.1 study, whole, under the measured plan (goal: under 3 minutes on one H100)
            ( t0=$(date +%s)
              timeout "$budget" "$PY" -m uqreg.cli sweep --preset paper-e1 --device "$DEVICE" \
                  --workers "$E1_WORKERS" --chunk-repetitions 50 --max-memory 64 --out "$E1_OUT" \
                  --backend "$E1_BACKEND" \
                  --no-plots --quiet \
                  $([ "$CUDA_GRAPHS" = 1 ] && echo --cuda-graphs)
              rc=$?
              echo "RESULT paper_e1_wall_s=$(( $(date +%s) - t0 )) paper_e1_exit=$rc" \
                   "cells=$(count "$E1_OUT/cells" '*.nc') workers=$E1_WORKERS backend=$E1_BACKEND"
              # where the time went: per method, the seconds fixed per cell and per level of c
              "$PY" packages/uqreg/benchmarks/sweep_profile.py "$E1_OUT/cells" --top 5
              exit $rc ) ;;
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
    grep -h '^RESULT\|^DETAIL' "$WORK/$name.log" | sed "s/^/$name: /" >> "$OUT/results.txt"
    cp "$XDG_CACHE_HOME/uqreg/engine_plan.json" "$OUT/" 2>/dev/null || true  # the plans measured so far
}

for item in $ITEMS; do
    run_item "${item%%:*}" "${item##*:}"
done
