#!/usr/bin/env bash
# The device check: what runs on a lent GPU machine, in two commands whose
# deadlines add up to 12 minutes (420 s and 300 s), install included, so that
# both fit the 15 minutes of device time with the machine's start
# (docs/journal.md, "The device check"). Results go under $OUT, each
# stage's as it runs.
#
#   scripts/device_check.sh 1         # install, info, the GPU test tier, then the
#                                     # stencil launch variants in the time left
#   scripts/device_check.sh 2         # install, info, kernel benches (stencil, nbody,
#                                     # md, matrix; cuda and cupy), engine (bench comm), weather
#   scripts/device_check.sh plan      # the time plan of both commands (seconds per stage)
#   scripts/device_check.sh rehearse  # here, without a GPU: both commands under the CUDA
#                                     # simulator at tiny sizes, within the same limits, in a
#                                     # Python 3.12 environment that has only the GPU image's
#                                     # packages (3.11 where there is no 3.12)
#
# Each stage runs under `timeout -k 5`, clipped to what is left of the
# command's DEADLINE_S (default 420 s for command 1, 300 s for command 2,
# from the start of the command, minus a reserve for the summary), so the
# summary is always written: a stage that no longer fits is recorded as
# skipped. $OUT/stages.jsonl gets one line per stage (status, seconds, CPU
# seconds, timeout); $OUT/summary.txt (also printed) lists
# them with the key numbers.
#
# The device tool brings back only about 8 files from $OUT per call, so at the
# end of each command on a GPU every other result (stage logs, .jsonl files,
# gpu-tests.xml, the weather picture) is packed into $OUT/results.tar.gz and
# removed: summary.txt, stages.jsonl and results.tar.gz come back (unpack with
# `tar -xzf results.tar.gz`). The rehearsal (REHEARSE=1) keeps the files as they
# are, since it reads them, and checks the packing on a copy; PACK=0 keeps them
# on a GPU too. Give each command a fresh $OUT (the device tool does): an
# archive already there is replaced. The GPU image has numpy, numba, numba-cuda and
# CuPy but not dask, zarr, bokeh or pytest-timeout: carry their wheels in
# .whl (scripts/gpu_wheelhouse.sh). CPU-only work (bench-cpu, scaling on
# numba workers, the CPU tier, CPU acceptance) does not belong here: it runs
# on the development machine.
#
# Environment: OUT (default /tmp/hpcgpu-device), DEADLINE_S (420 / 300),
# WHEELS (.whl), SITE (where the wheels and hpcgpu are installed,
# /tmp/hpcgpu-site; command 2 reuses command 1's install there when the
# machine is still warm and the sources, wheels and Python are the same),
# PY (python3), PACK (1: pack the results at the end, as above; 0: leave
# them). REHEARSE=1 selects the rehearsal sizes (the `rehearse` mode
# sets it); REHEARSAL_ENV and REHEARSAL_PYTHON choose the rehearsal's
# environment and its interpreter.
set -u
SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
ROOT=$(cd "$(dirname "$SELF")/.." && pwd)
cd "$ROOT" || exit 1
MODE=${1:-help}

# The time plan: command, stage, timeout (s), and "fill" for a stage that
# only gets what the stages before it left (clipped to the deadline).
# The device time is 15 minutes in all, the machine's start (a few minutes)
# included: the two commands' deadlines add up to 12 minutes (720 s), and
# the sum of each command's non-fill timeouts plus the reserve stays within
# its deadline. Priority: the GPU test tier (kernels, workloads, then the
# partition tests with the NCCL communicator), the kernel benches, the
# engine's communicator bench, one weather run.
plan_table() {
cat <<'EOF'
1 install 40
1 info 15
1 gpu-tests 315
1 variants 60 fill
2 install 40
2 info 15
2 stencil-cuda 25
2 stencil-cupy 20
2 nbody-cuda 20
2 nbody-cupy 15
2 md-cuda 25
2 md-cupy 15
2 matrix-cuda 40
2 matrix-cupy 20
2 engine 20
2 weather 30
EOF
}
plan_deadline() { case $1 in 1) echo 420 ;; 2) echo 300 ;; esac; }
KILL_S=${KILL_S:-5}              # timeout -k: grace after TERM (INT for the test tier) before KILL
RESERVE_S=${RESERVE_S:-10}       # kept back for the summary
MIN_STAGE_S=${MIN_STAGE_S:-10}   # a stage with less time left is skipped

planned() { plan_table | awk -v c="$1" -v s="$2" '$1 == c && $2 == s { print $3 }'; }

print_plan() {
    plan_table | awk -v d1="${DEADLINE_S:-$(plan_deadline 1)}" -v d2="${DEADLINE_S:-$(plan_deadline 2)}" \
                     -v r="$RESERVE_S" -v k="$KILL_S" '
        { fill = ($4 == "fill"); printf "%s %-13s %4d s%s\n", $1, $2, $3, fill ? "  (fill: clipped to what is left)" : "";
          if (!fill) { sum[$1] += $3; n[$1]++ } }
        END { d[1] = d1; d[2] = d2
              for (c = 1; c <= 2; c++)
                  printf "command %d: %d s of timeouts + %d s reserve = %d s (deadline %d s; each stage is " \
                         "clipped so that its timeout and %d s kill grace end before the reserve)\n",
                         c, sum[c], r, sum[c] + r, d[c], k
              printf "both commands: deadlines %d s + %d s = %d s (%.1f min) of the 15 min of device time; the rest " \
                     "is for the start of the machine, transfers and idle\n", d[1], d[2], d[1] + d[2], (d[1] + d[2]) / 60 }'
}

rehearsal_sizes() {
    # Tiny sizes for the CUDA simulator; the same stages and options otherwise.
    STENCIL_ARGS="--size 32 --steps 2 --dtype float32 --budget 0.05"
    NBODY_ARGS="--size 16 --steps 1 --dtype float32 --budget 0.05"
    MD_ARGS="--size 108 --steps 1 --dtype float32 --budget 0.05"   # the least the md bench takes
    MATRIX_ARGS="--size 16 --steps 1 --dtype float32 --budget 0.05"
    COMM_ARGS="--workers 2 --size 4096 --repeats 3"
    WEATHER_ARGS="--nx 32 --ny 16 --dtype float32 --steps 2 --snapshots 1"
    VARIANTS_ARGS="--size 32 --check-size 32 --repeats 1 --dtype float32"
    TEST_TIMEOUT=${TEST_TIMEOUT:-120}
}

gpu_sizes() {
    STENCIL_ARGS="--size 8192 --dtype float32 --dtype float64 --budget 1"
    NBODY_ARGS="--size 16384 --size 131072 --dtype float32 --dtype float64 --budget 1"
    MD_ARGS="--size 1048576 --steps 20 --dtype float32 --dtype float64 --budget 1"
    MATRIX_ARGS="--size 8192 --dtype float32 --dtype float64 --budget 1"
    COMM_ARGS="--workers 2 --size 4096 --size 1048576 --size 16777216 --repeats 50"
    WEATHER_ARGS="--nx 2048 --ny 1024 --dtype float32 --stop-time 43200 --snapshots 2"  # ~7,400 steps
    VARIANTS_ARGS="--size 8192 --check-size 2048 --repeats 15"
    TEST_TIMEOUT=${TEST_TIMEOUT:-60}    # pytest-timeout, per test: one hang does not eat the tier
}

setup_env() {
    OUT=${OUT:-/tmp/hpcgpu-device}
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    WHEELS=${WHEELS:-$ROOT/.whl}
    SITE=${SITE:-/tmp/hpcgpu-site}
    PY=${PY:-python3}
    export OUT WHEELS SITE PY PYTHONUNBUFFERED=1
    # -P for every Python started from here on (subprocesses of tests, dask workers): the source
    # tree's hpcgpu/ lacks the mapped subpackages (kernels/, workloads/), so it must not come first.
    export PYTHONSAFEPATH=1
    export PYTHONPATH=$SITE
    export PATH=$SITE/bin:$PATH
    export MPLBACKEND=Agg
    if [[ ${REHEARSE:-0} == 1 ]]; then
        # The same limits as on the GPU: the sizes are tiny enough for the CUDA simulator (which
        # runs a block's threads as Python threads) to finish each stage well within them.
        export NUMBA_ENABLE_CUDASIM=1 HPCGPU_REQUIRE_GPU=0
        rehearsal_sizes
    else
        export HPCGPU_REQUIRE_GPU=1
        gpu_sizes
    fi
}

record() {  # record STAGE STATUS SECONDS TIMEOUT PLANNED NOTE [CPU_SECONDS]
    printf '{"command": "%s", "stage": "%s", "status": %s, "seconds": %s, "cpu_seconds": %s, "timeout": %s, "planned": %s, "note": "%s"}\n' \
        "$COMMAND" "$1" "$2" "$3" "${7:-null}" "$4" "$5" "$6" >> "$OUT/stages.jsonl"
}

now() { date +%s.%N; }

# CPU seconds (user + system) of this shell's waited-for children so far. Bash's `times` must run
# in this shell, not in a subshell (whose children are its own): `children_cpu; x=$CHILDREN_CPU`.
# A stage's CPU time next to its wall time tells a stage that needed its time from one that
# waited for the CPUs of a busy machine.
children_cpu() {
    times > "$OUT/.times"
    CHILDREN_CPU=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); t += p[1] * 60 + p[2] }
                                  printf "%.2f", t }' "$OUT/.times")
}

# The install's identity: the sources and wheels it was made from, and the Python that made it.
install_stamp() {
    { "$PY" -c 'import sys; print(sys.version)'; ls -l "$WHEELS"/*.whl | awk '{ print $5, $NF }'
      tar -C "$ROOT" --exclude=__pycache__ --sort=name --mtime=@0 --owner=0 --group=0 -cf - \
          pyproject.toml README.md hpcgpu kernels workloads; } 2>/dev/null | sha256sum | cut -d' ' -f1
}

# run_stage NAME KIND CMD...: KIND "jsonl": stdout appended to NAME.jsonl, stderr to NAME.log;
# KIND "log": stdout and stderr to NAME.log (line by line, through tee). SIGNAL (default TERM)
# is what timeout sends first.
run_stage() {
    local name=$1 kind=$2 nominal left t rc start cpu0 secs cpu stamp note=""
    shift 2
    nominal=$(planned "$COMMAND" "$name")
    left=$(( DEADLINE_S - (SECONDS - T0) - KILL_S - RESERVE_S ))
    t=$(( nominal < left ? nominal : left ))
    if (( t < MIN_STAGE_S )); then
        echo "== $name: skipped, ${left} s left of the deadline"
        record "$name" null 0 0 "$(planned "$COMMAND" "$name")" "skipped: no time left"
        return
    fi
    # the stamp of the sources as they are now, before the install copies them
    [[ $name == install ]] && stamp=$(install_stamp)
    if [[ $name == install && -d $SITE/hpcgpu && -f $SITE/.install-stamp && $(cat "$SITE/.install-stamp") == "$stamp" ]]
    then
        echo "== install: reusing $SITE (made from the same sources, wheels and Python)"
        record install 0 0 "$t" "$(planned "$COMMAND" install)" "reused the install in $SITE" 0
        return
    fi
    (( t < nominal )) && note="clipped to the deadline"
    echo "== $name (timeout $t s$([[ -n $note ]] && echo ", $note"); $(date +%T))"
    children_cpu
    cpu0=$CHILDREN_CPU
    start=$(now)
    if [[ $kind == jsonl ]]; then
        timeout -s "${SIGNAL:-TERM}" -k "$KILL_S" "$t" "$@" >> "$OUT/$name.jsonl" 2>> "$OUT/$name.log"
        rc=$?
        tail -n 4 "$OUT/$name.log"
    else
        timeout -s "${SIGNAL:-TERM}" -k "$KILL_S" "$t" "$@" 2>&1 | tee -a "$OUT/$name.log" | tail -n "${TAIL_LINES:-6}"
        rc=${PIPESTATUS[0]}
    fi
    secs=$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    children_cpu
    cpu=$(awk -v a="$cpu0" -v b="$CHILDREN_CPU" 'BEGIN { printf "%.1f", b - a }')
    (( rc == 124 || rc == 137 )) && note="${note:+$note; }timed out"
    [[ $name == install && $rc == [03] ]] && echo "$stamp" > "$SITE/.install-stamp"
    record "$name" "$rc" "$secs" "$t" "$(planned "$COMMAND" "$name")" "$note" "$cpu"
    echo "-- $name: exit status $rc in $secs s (CPU $cpu s)${note:+ ($note)}"
}

# A bench suite on one backend; a run that ends with no line (cupy missing, say) leaves one
# error line in NAME.jsonl, so that every stage reports in the same place.
bench() {  # bench NAME SUITE BACKEND ARGS...
    local name=$1 suite=$2 backend=$3
    shift 3
    run_stage "$name" jsonl "$PY" -m hpcgpu.cli bench "$suite" --backend "$backend" "$@"
    if [[ ! -s "$OUT/$name.jsonl" ]]; then
        "$PY" - "$OUT/$name.jsonl" "$OUT/$name.log" "$suite" "$backend" <<'PY'
import json, sys
jsonl, log, suite, backend = sys.argv[1:]
try:
    lines = [line.strip() for line in open(log, errors="replace") if line.strip()]
except OSError:
    lines = ["the stage did not run (no time left)"]
error = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "no output")
with open(jsonl, "a") as f:
    f.write(json.dumps({"suite": suite, "backend": backend, "case": None, "error": error[:1000]}) + "\n")
PY
    fi
}

# ---- stages run as subcommands (under timeout, in their own process) ----

stage_install() {
    # Exit status: 0 all well; 1 hpcgpu or a module every stage needs does not import (the command
    # stops); 3 an optional module (dask, zarr, bokeh, pytest-timeout) is missing: stages go on.
    rm -rf "$SITE" && mkdir -p "$SITE" || return 1
    local src rc
    src=$(mktemp -d)
    # hpcgpu is built from a clean copy: an in-tree build would write build/ into the checkout
    # (and a stale build/lib can put deleted modules back into the wheel).
    tar -C "$ROOT" --exclude=__pycache__ -cf - pyproject.toml README.md hpcgpu kernels workloads | tar -C "$src" -xf -
    local wheels=("$WHEELS"/*.whl)
    [[ -e ${wheels[0]} ]] || { echo "no wheels in $WHEELS: run scripts/gpu_wheelhouse.sh and carry .whl"; return 1; }
    # Only the wheels this Python can install (one that is not, for another Python version, would
    # fail the whole pip command): the others are named, and the import check says what is missing.
    mapfile -t wheels < <("$PY" - "${wheels[@]}" <<'PY'
import os, sys
try:
    from pip._vendor.packaging.tags import sys_tags
    from pip._vendor.packaging.utils import parse_wheel_filename
    supported = set(sys_tags())
except Exception:  # noqa: BLE001 - an old pip: try them all
    supported = None
for path in sys.argv[1:]:
    if supported is None or parse_wheel_filename(os.path.basename(path))[3] & supported:
        print(path)
    else:
        print(f"not for this Python, left out: {os.path.basename(path)}", file=sys.stderr)
PY
)
    echo "installing ${#wheels[@]} wheels from $WHEELS and hpcgpu into $SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
        --target "$SITE" "${wheels[@]}" || { rm -rf "$src"; return 1; }
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --disable-pip-version-check \
        --target "$SITE" "$src"
    rc=$?
    rm -rf "$src"
    (( rc == 0 )) || return 1
    "$PY" - <<'PY'
import importlib, os, sys
needed, missing = [], []
for name in ("hpcgpu", "hpcgpu.kernels", "hpcgpu.workloads", "hpcgpu.cli", "numpy", "numba", "pytest",
             "dask", "distributed", "zarr", "bokeh", "pytest_timeout", "scipy", "xarray"):
    try:
        importlib.import_module(name)
    except Exception as error:  # noqa: BLE001
        (needed if name.startswith("hpcgpu") or name in ("numpy", "numba", "pytest") else missing).append(
            f"{name} ({type(error).__name__}: {error})")
hpcgpu = sys.modules.get("hpcgpu")
if hpcgpu is not None:
    print(f"hpcgpu from {hpcgpu.__file__}")
    if not hpcgpu.__file__.startswith(os.environ["SITE"]):
        needed.append(f"hpcgpu (imported from {hpcgpu.__file__}, not from {os.environ['SITE']})")
if needed or missing:
    print("cannot import: " + "; ".join(needed + missing))
    sys.exit(1 if needed else 3)
print("every module the stages need imports")
PY
}

stage_info() {
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi -L
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    else
        echo "no nvidia-smi on this machine"
    fi
    "$PY" -c 'import sys; print("python", sys.version.split()[0])'
    "$PY" -m pip list --disable-pip-version-check 2>/dev/null \
        | grep -iE "^(numba|numba-cuda|cupy|numpy|dask|distributed|zarr|xarray|nvidia-nccl|cuda-bindings|pytest) "
    "$PY" -m hpcgpu.cli info
}

stage_tier() {
    # Priority order: kernels, workloads, partition (the engine's NCCL checks), then the rest.
    local paths=(tests/kernels tests/workloads tests/partition) d
    for d in tests/*/; do
        d=${d%/}
        [[ $d == tests/__pycache__ || " ${paths[*]} " == *" $d "* ]] || paths+=("$d")
    done
    paths+=(tests/test_*.py)
    # SIGINT from timeout ends pytest as a KeyboardInterrupt: it still writes the junit XML and the
    # summary. Python ignores SIGINT when started with it ignored (a background job), so restore it.
    "$PY" -c 'import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); sys.exit(pytest.main(sys.argv[1:]))' \
        "${paths[@]}" -m gpu -v -rA --durations=25 --continue-on-collection-errors -p no:cacheprovider \
        -o addopts="--import-mode=importlib --strict-markers" -o timeout="$TEST_TIMEOUT" \
        -o pythonpath="$SITE tests ." --junitxml="$OUT/gpu-tests.xml"
}

stage_weather() {
    local dir
    dir=$(mktemp -d)
    "$PY" -m hpcgpu.cli run weather $WEATHER_ARGS --backend cuda --no-progress --out "$dir/weather"
    local rc=$?
    cp "$dir/weather/summary.json" "$OUT/weather-summary.json" 2>/dev/null
    cp "$dir/weather/final.png" "$OUT/weather-final.png" 2>/dev/null
    rm -rf "$dir"
    return $rc
}

installed() {  # the install stage left hpcgpu importable (status 0, or 3: an optional module missing)
    [[ $(tail -n 1 "$OUT/stages.jsonl") == *'"stage": "install", "status": '[03],* ]]
}

command_1() {
    run_stage install log "$SELF" _install
    installed || { summary; return 1; }
    run_stage info log "$SELF" _info
    SIGNAL=INT TAIL_LINES=25 run_stage gpu-tests log "$SELF" _tier
    run_stage variants log "$PY" "$ROOT/scripts/gpu_kernel_variants.py" $VARIANTS_ARGS --jsonl "$OUT/variants.jsonl"
    summary
}

command_2() {
    run_stage install log "$SELF" _install
    installed || { summary; return 1; }
    run_stage info log "$SELF" _info
    bench stencil-cuda stencil cuda $STENCIL_ARGS
    bench stencil-cupy stencil cupy $STENCIL_ARGS
    bench nbody-cuda nbody cuda $NBODY_ARGS
    bench nbody-cupy nbody cupy $NBODY_ARGS
    bench md-cuda md cuda $MD_ARGS
    bench md-cupy md cupy $MD_ARGS
    bench matrix-cuda matrix cuda $MATRIX_ARGS
    bench matrix-cupy matrix cupy $MATRIX_ARGS
    run_stage engine jsonl "$PY" -m hpcgpu.cli bench comm $COMM_ARGS
    run_stage weather log "$SELF" _weather
    summary
}

summary() {
    "$PY" "$ROOT/scripts/device_check_summary.py" "$OUT" $([[ ${REHEARSE:-0} == 1 ]] && echo --rehearsal) \
        > "$OUT/summary.txt" 2>&1 \
        || echo "(the summary script failed: see the end of summary.txt and the stage logs)" >> "$OUT/summary.txt"
    echo
    cat "$OUT/summary.txt"
}

# The files of DIR that the device tool would not all bring back, packed into DIR/results.tar.gz and
# removed; summary.txt and stages.jsonl stay beside it (the .times scratch file goes). Where tar fails
# the files stay as they are. A line saying which it was ends summary.txt.
pack_results() {  # pack_results DIR
    local dir=$1 files kib line
    rm -f "$dir/.times"
    mapfile -t files < <(cd "$dir" && find . -type f | sed 's|^\./||' | sort \
                         | grep -vxF -e summary.txt -e stages.jsonl -e results.tar.gz -e results.tar.gz.part)
    (( ${#files[@]} )) || return 0
    if tar -C "$dir" -czf "$dir/results.tar.gz.part" -- "${files[@]}" \
        && mv -f "$dir/results.tar.gz.part" "$dir/results.tar.gz"; then
        (cd "$dir" && rm -f -- "${files[@]}")
        find "$dir" -mindepth 1 -type d -empty -delete
        kib=$(du -k "$dir/results.tar.gz" | cut -f1)
        line="results: ${#files[@]} files packed into results.tar.gz ($kib KiB; tar -xzf results.tar.gz), beside summary.txt and stages.jsonl"
    else
        rm -f "$dir/results.tar.gz.part"
        line="results: packing the other files into results.tar.gz failed: they stay as they are"
    fi
    echo "$line" >> "$dir/summary.txt"
    echo "$line"
}

# The rehearsal's check of pack_results, on a copy of DIR (the rehearsal itself keeps its files):
# afterwards only summary.txt, stages.jsonl and the archive are left, and the archive holds the rest.
rehearse_packing() {  # rehearse_packing DIR
    local copy expected left archived
    copy=$(mktemp -d)
    cp -r "$1/." "$copy/"
    expected=$(cd "$copy" && find . -type f ! -name .times | sed 's|^\./||' | grep -vxF -e summary.txt -e stages.jsonl | sort)
    "$SELF" _pack "$copy" > /dev/null
    left=$(cd "$copy" && find . -type f | sed 's|^\./||' | sort | tr '\n' ' ')
    archived=$(tar -tzf "$copy/results.tar.gz" 2> /dev/null | grep -v '/$' | sort)
    rm -rf "$copy"
    if [[ $left == "results.tar.gz stages.jsonl summary.txt " && -n $expected && $archived == "$expected" ]]; then
        echo "packing: ok ($(echo "$expected" | wc -l) files of command 2 into results.tar.gz; summary.txt and stages.jsonl beside it)"
    else
        echo "packing: FAILED: left ${left:-nothing}; archived $(echo $archived); expected $(echo $expected)"
        return 1
    fi
}

# ---- the rehearsal ----

# The GPU image's packages (less CuPy and NCCL: several hundred MB and useless without a GPU;
# mpi4py where a binary wheel installs), at the versions this project's CI uses.
IMAGE_PACKAGES="numpy==2.4.6 numba==0.68.1 numba-cuda==0.30.4 scipy==1.17.1 pandas==3.1.1 matplotlib==3.11.2
xarray==2026.9.0 pytest==9.2.0 hypothesis==6.170.17 tqdm==4.70.1 pyyaml==6.0.4 psutil==7.2.2 msgpack==1.2.4
toolz==1.2.0 cloudpickle==3.1.3 sortedcontainers==2.4.0 nvidia-ml-py==13.615.71"

# The rehearsal's interpreter: Python 3.12 (the image's) where there is one, else 3.11 or a later
# python3 (the pins above need 3.11 or later), one that can make a virtual environment with pip.
rehearsal_python() {
    local p
    for p in "${REHEARSAL_PYTHON:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12 /usr/bin/python3.12 \
             /usr/local/bin/python3.12 python3.11 /usr/bin/python3.11 /usr/local/bin/python3.11 python3; do
        [[ -n $p ]] && command -v "$p" > /dev/null 2>&1 \
            && "$p" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] < (3, 11))' 2>/dev/null \
            && { echo "$p"; return; }
    done
    return 1
}

rehearse() {
    local python version envdir stamp wanted out started
    python=$(rehearsal_python) || { echo "rehearse: no Python 3.12 or 3.11 here (with venv and ensurepip)"; return 1; }
    version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [[ $version == 3.12 ]] || echo "rehearse: Python 3.12 not found; using $python ($version; the GPU image has 3.12)"
    envdir=${REHEARSAL_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/hpcgpu/device-rehearsal-py$version}
    wanted="$version $(echo $IMAGE_PACKAGES | tr ' ' '\n' | sort | tr '\n' ' ')"
    stamp=$envdir/.image-packages
    started=$SECONDS
    if [[ ${FRESH:-0} == 1 || ! -f $stamp || $(cat "$stamp") != "$wanted" ]]; then
        echo "rehearse: building the image-like environment $envdir (Python $version; no CuPy, no NCCL)"
        rm -rf "$envdir"
        "$python" -m venv "$envdir" || return 1
        "$envdir/bin/python" -m pip install -q --disable-pip-version-check --no-compile --only-binary=:all: \
            $IMAGE_PACKAGES || return 1
        "$envdir/bin/python" -m pip install -q --disable-pip-version-check --no-compile --only-binary=:all: mpi4py \
            || echo "rehearse: no binary wheel of mpi4py installs here: the environment goes without it"
        echo "$wanted" > "$stamp"
    else
        echo "rehearse: reusing the image-like environment $envdir (FRESH=1 rebuilds it)"
    fi
    echo "rehearse: environment ready in $(( SECONDS - started )) s"
    # .whl is what the GPU gets (CPython 3.12); another Python gets its own wheelhouse beside its environment.
    local wheels=${WHEELS:-$ROOT/.whl}
    [[ $version == 3.12 || -n ${WHEELS:-} ]] || wheels=$envdir/wheelhouse
    PYTHON="$envdir/bin/python" PYTHON_VERSION=$version "$ROOT/scripts/gpu_wheelhouse.sh" "$wheels" || return 1
    out=${OUT:-$ROOT/test-artifacts/device-rehearsal}
    rm -rf "$out" && mkdir -p "$out"
    out=$(cd "$out" && pwd)
    local site=${SITE:-$(mktemp -d)/site} c
    for c in 1 2; do
        echo
        echo "######## rehearsal of command $c"
        # command 2 reuses command 1's install (the same stamp), as on a machine still warm
        env -u PYTHONPATH -u VIRTUAL_ENV REHEARSE=1 OUT="$out/$c" PY="$envdir/bin/python" SITE="$site" \
            WHEELS="$wheels" PATH="$envdir/bin:$PATH" "$SELF" "$c"
    done
    # The tier's collection on a bare image (hpcgpu alone, no wheelhouse): modules that need dask,
    # zarr, bokeh, ... must skip, not fail to import.
    echo
    echo "######## rehearsal: collecting the GPU tier on a bare image (no wheelhouse)"
    local bare
    bare=$(mktemp -d)
    cp -r "$site"/hpcgpu "$site"/hpcgpu-*.dist-info "$bare"/
    env -u VIRTUAL_ENV PYTHONSAFEPATH=1 PYTHONPATH="$bare" NUMBA_ENABLE_CUDASIM=1 HPCGPU_REQUIRE_GPU=0 \
        timeout -k 10 300 "$envdir/bin/python" -m pytest tests -m gpu --collect-only -q -p no:cacheprovider \
        -o addopts="--import-mode=importlib --strict-markers" -o pythonpath="$bare tests ." \
        > "$out/bare-collection.log" 2>&1
    echo "exit status $?" >> "$out/bare-collection.log"
    tail -n 2 "$out/bare-collection.log"
    rm -rf "$bare"
    [[ -n ${SITE:-} ]] || rm -rf "$(dirname "$site")"
    echo
    echo "######## rehearsal: packing a copy of command 2's results, as at the end of a command on a GPU"
    local packing rc
    packing=$(rehearse_packing "$out/2")
    rc=$?
    echo "$packing"
    "$envdir/bin/python" "$ROOT/scripts/device_check_summary.py" --verdict "$out/1" "$out/2" | tee "$out/rehearsal.txt"
    (( PIPESTATUS[0] == 0 )) || rc=1
    echo "$packing" >> "$out/rehearsal.txt"
    return "$rc"
}

case $MODE in
    1|2)
        COMMAND=$MODE
        T0=$SECONDS
        DEADLINE_S=${DEADLINE_S:-$(plan_deadline "$COMMAND")}
        setup_env
        : > "$OUT/stages.jsonl"
        echo "device check, command $COMMAND$([[ ${REHEARSE:-0} == 1 ]] && echo " (rehearsal: CUDA simulator, tiny sizes)"); deadline $DEADLINE_S s; results in $OUT"
        "command_$COMMAND"
        status=$?
        # only about 8 files come back from a device call: one archive instead of a file per stage
        [[ ${REHEARSE:-0} == 1 || ${PACK:-1} == 0 ]] || pack_results "$OUT"
        exit "$status"
        ;;
    _install) setup_env; stage_install ;;
    _info) setup_env; stage_info ;;
    _tier) setup_env; stage_tier ;;
    _weather) setup_env; stage_weather ;;
    _pack) pack_results "${2:?which folder}" ;;
    plan) print_plan ;;
    rehearse) rehearse ;;
    *)
        sed -n '2,/^set -u/p' "$SELF" | sed '$d'
        [[ $MODE == help || $MODE == -h || $MODE == --help ]]
        ;;
esac
