#!/usr/bin/env bash
# One session on a lent GPU machine: install, run the GPU test tier, run the
# benchmarks and a weather run; results go under $OUT (see docs/benchmarks.md).
#
# The GPU image has numpy, numba, numba-cuda and cupy but not dask or zarr:
# carry their wheels in .whl (../shared/tools/gpu-wheelhouse.sh).
set -u
OUT=${OUT:-/tmp/hpcgpu-device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . || exit 1
# -P: do not put the source tree first on sys.path (its hpcgpu/ lacks the mapped subpackages)
PY="python3 -P"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv;
  $PY -m pip list 2>/dev/null | grep -iE "numba|cupy|numpy|dask|distributed|zarr|xarray";
  $PY -m hpcgpu.cli info; } > "$OUT/info.txt" 2>&1
cat "$OUT/info.txt"
# STAGES selects what runs (default: all):
#   variants tests engine bench-cpu bench-gpu nbody matrix scaling weather acceptance cpu-tests
STAGES=${STAGES:-"variants tests engine bench-cpu bench-gpu nbody matrix scaling weather acceptance cpu-tests"}
has() { [[ " $STAGES " == *" $1 "* ]]; }
if has variants; then
echo "== GPU kernel variants"
timeout ${VARIANTS_S:-120} $PY scripts/gpu_kernel_variants.py --json "$OUT/variants.json" 2>&1 | tee "$OUT/variants.txt" | tail -40
fi
if has tests; then
echo "== GPU test tier"
HPCGPU_REQUIRE_GPU=1 timeout ${GPU_TESTS_S:-240} $PY -m pytest tests -m gpu -q -p no:cacheprovider \
    -o addopts="--import-mode=importlib" 2>&1 | tee "$OUT/gpu-tests.log" | tail -25
fi
if has engine; then
# The SPMD engine's NCCL transport (hpcgpu/partition/nccl_comm.py): its communicator contract on CuPy arrays,
# mandatory here (a skip says why NCCL would not run two ranks on this machine), then bench comm on two local
# workers. Two files: engine.log (tests, skip reasons, bench stderr) and comm.jsonl. At most ~4.5 minutes.
echo "== engine: the NCCL communicator contract and bench comm"
{ HPCGPU_REQUIRE_GPU=1 timeout -k 10 ${NCCL_TESTS_S:-180} $PY -m pytest tests/partition/test_nccl.py -q -rs \
      -p no:cacheprovider -o addopts="--import-mode=importlib" -o timeout=120
  echo "pytest exit status $?"; } 2>&1 | tee "$OUT/engine.log" | tail -25
timeout -k 10 ${COMM_S:-90} $PY -m hpcgpu.cli bench comm --workers 2 --size 4096 --size 1048576 --size 16777216 \
    --repeats 50 > "$OUT/comm.jsonl" 2>> "$OUT/engine.log"
echo "bench comm exit status $?" | tee -a "$OUT/engine.log"
$PY - "$OUT/comm.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['case']:16s} {r['size']:>9d} B {r['value']:10.4g} {r['unit']:4s} {r.get('transport')} {r.get('path')}")
PY
fi
echo "== benchmarks"
: > "$OUT/bench.jsonl"
has bench-cpu && timeout ${BENCH_S:-200} $PY -m hpcgpu.cli bench stencil --size 4096 --budget 2 \
    --backend numpy --backend numba >> "$OUT/bench.jsonl" 2>> "$OUT/bench.err"
has bench-gpu && timeout ${BENCH_S:-200} $PY -m hpcgpu.cli bench stencil --size 4096 --size 8192 \
    --dtype float32 --dtype float64 --backend cuda --backend cupy --budget 2 >> "$OUT/bench.jsonl" 2>> "$OUT/bench.err"
has bench-gpu && { timeout ${MD_S:-150} $PY -m hpcgpu.cli bench md --backend cuda --backend cupy --size 1048576 --steps 20 --dtype float32 --dtype float64 --budget 2 > "$OUT/md.jsonl" 2> "$OUT/md.err"; cut -c1-420 "$OUT/md.jsonl"; }
$PY - "$OUT/bench.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("error"):
        print(f"{r['case']:14s} {r['backend']:6s} {r['dtype']:8s} {r['size']:5d} ERROR {r['error'][:200]}")
        continue
    print(f"{r['case']:14s} {r['backend']:6s} {r['dtype']:8s} {r['size']:5d} {r['value']/1e9:9.2f} Gpt/s "
          f"x{(r['ratio_to_numpy'] or 0):7.1f}  {r.get('gb_per_s', 0):8.1f} GB/s eff  "
          f"{r.get('fraction_of_copy', 0)*100:5.1f}% of copy ({r.get('copy_gb_per_s', 0):.0f} GB/s)")
PY
if has nbody; then
echo "== N-body on the GPU"
timeout ${NBODY_S:-120} $PY -m hpcgpu.cli bench nbody --backend cuda --backend cupy --size 16384 --size 131072 \
    --dtype float32 --dtype float64 --budget 2 > "$OUT/nbody.jsonl" 2> "$OUT/nbody.err"
$PY - "$OUT/nbody.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r.get("backend"), r.get("dtype"), r.get("size"), r.get("value"), r.get("gflops"), r.get("error", ""))
PY
fi
if has matrix; then
echo "== matrix kernels on the GPU (GEMM n = 8192, SpMV on the 8192^2-point Poisson matrix)"
timeout ${MATRIX_S:-180} $PY -m hpcgpu.cli bench matrix --backend cuda --backend cupy --size 8192 \
    --dtype float32 --dtype float64 --budget 2 > "$OUT/matrix.jsonl" 2> "$OUT/matrix.err"
$PY - "$OUT/matrix.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("error"):
        print(r["case"], r["backend"], r["dtype"], r["size"], "ERROR", r["error"][:200]); continue
    scale, unit = (1e12, "TFLOP/s") if r["metric"] == "flops_per_s" else (1e9, "GB/s")
    print(f"{r['case']:10s} {r['backend']:5s} {r['dtype']:8s} {r['size']:5d} {r['value']/scale:8.2f} {unit}"
          f"  cuBLAS fraction {r.get('fraction_of_cublas') or 0:.2f}  copy fraction {r.get('fraction_of_copy') or 0:.2f}"
          f"  rel. error {r.get('relative_error', 0):.1e}")
PY
fi
if has scaling; then
echo "== scaling on the CPU cores of this machine (numba workers)"
timeout ${SCALING_S:-240} $PY -m hpcgpu.cli bench scaling weather --backend numba --size 2048 --steps 16 \
    --workers ${SCALING_WORKERS:-8} > "$OUT/scaling.jsonl" 2> "$OUT/scaling.err"
echo "== one GPU worker against dask.array.map_overlap once per step"
timeout ${SCALING_GPU_S:-120} $PY -m hpcgpu.cli bench scaling weather --backend cuda --size 4096 --steps 16 \
    >> "$OUT/scaling.jsonl" 2>> "$OUT/scaling.err"
$PY - "$OUT/scaling.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    extra = {k: r[k] for k in ("workers", "steps_per_task", "scheduler_share", "compute_s", "halo_s",
                                "rows_per_partition", "weights") if k in r}
    print(f"{r['case']:22s} {r['metric']:24s} {r['value']:10.4g} {extra}")
PY
fi
if has weather; then
echo "== weather on the GPU"
timeout ${RUN_S:-90} $PY -m hpcgpu.cli run weather --nx 2048 --ny 1024 --dtype float32 --backend cuda \
    --stop-time 345600 --snapshots 2 --no-progress --out /tmp/weather > "$OUT/weather.txt" 2>&1
cat "$OUT/weather.txt"; cp /tmp/weather/final.png /tmp/weather/summary.json "$OUT/" 2>/dev/null
fi
if has acceptance; then
echo "== cluster acceptance on this GPU machine (one dask-cuda worker per GPU, quick sizes)"
timeout ${ACCEPT_S:-150} $PY -m hpcgpu.cli bench --quick --report "$OUT/acceptance.html" \
    > "$OUT/acceptance.jsonl" 2> "$OUT/acceptance.err"
tail -12 "$OUT/acceptance.err"
fi
if has cpu-tests; then
echo "== CPU tier on this machine"
timeout ${CPU_TESTS_S:-150} $PY -m pytest tests -m "not gpu" -q -x -p no:cacheprovider \
    -o addopts="--import-mode=importlib" 2>&1 | tee "$OUT/cpu-tests.log" | tail -5
fi
