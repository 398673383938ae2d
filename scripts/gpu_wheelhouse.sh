#!/usr/bin/env bash
# Download, here, the wheels the lent GPU machine's image lacks, into .whl/
# (git-ignored), for the device check (scripts/device_check.sh) to install
# there without a network. Target: CPython 3.12 on x86_64 Linux (manylinux);
# PYTHON_VERSION=3.11 makes a 3.11 wheelhouse instead (the rehearsal's, where
# a machine has no 3.12: keep it out of .whl, which the GPU gets).
#
# The image (as last read, see also ../shared/tools/gpu-wheelhouse.sh) has
# numpy, numba, numba-cuda, cupy-cuda13x, nvidia-nccl-cu13, mpi4py, scipy,
# pandas, matplotlib, xarray, pytest, hypothesis, tqdm, pyyaml, psutil,
# msgpack, toolz, cloudpickle, sortedcontainers, nvidia-ml-py (and their own
# dependencies). It lacks dask's stack (dask, distributed, dask-cuda,
# tornado, ...), zarr's (numcodecs, donfig, ...), bokeh's, pytest-timeout,
# and possibly setuptools (which installing hpcgpu itself needs). Those are
# listed below, pinned: about 12 MB. dask and distributed are pinned to the
# release dask-cuda 26.10 requires. The image has no nbclient, selenium or
# cryptography either: the tests that need them skip there.
#
#   scripts/gpu_wheelhouse.sh [DEST]     # DEST defaults to .whl
#
# Idempotent and offline when DEST already holds every listed wheel; wheels in
# DEST that are not listed (other versions) are deleted, so that the install
# on the GPU never sees two versions of one package. `--list` prints the pins.
# Carry DEST with the device tool (carry: [".whl"]); scripts/device_check.sh
# installs it with:
#   python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
set -euo pipefail
PINS="
dask==2026.7.1
distributed==2026.7.1
dask-cuda==26.10.0
rapids-dask-dependency==26.10.0
click==8.5.1
fsspec==2026.9.0
jinja2==3.1.6
markupsafe==3.0.4
locket==1.0.0
partd==1.4.2
tblib==3.2.2
tornado==6.6.1
zict==3.0.0
zarr==3.1.6
numcodecs==0.16.6
donfig==0.8.1.post1
google-crc32c==1.9.0
typing-extensions==4.16.0
bokeh==3.9.2
narwhals==2.29.0
xyzservices==2026.9.1
pytest-timeout==2.4.0
setuptools==80.9.0
"
# Before Python 3.12 dask needs the importlib-metadata backport (the rehearsal's 3.11 wheelhouse;
# the versions CI's environment has).
PINS_BEFORE_3_12="
importlib-metadata==10.2.0
zipp==4.1.2
lazy-importer==0.1.0
"
version=${PYTHON_VERSION:-3.12}
[[ $version =~ ^3\.([0-9]+)$ ]] || { echo "gpu_wheelhouse: PYTHON_VERSION must be like 3.12, not $version" >&2; exit 1; }
(( BASH_REMATCH[1] < 12 )) && PINS="$PINS$PINS_BEFORE_3_12"
if [[ "${1:-}" == "--list" ]]; then
    echo $PINS | tr ' ' '\n'
    exit 0
fi
dest=${1:-.whl}
mkdir -p "$dest"
PYTHON=${PYTHON:-python3}
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
# A wheel's file name starts with the normalized name (lower case, runs of -_. as _) and the version.
prefix() { local name=${1%%==*} version=${1##*==}; name=$(echo "$name" | tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/_/g'); echo "${name}-${version}-"; }
keep=()
missing=()
for pin in $PINS; do
    p=$(prefix "$pin")
    keep+=("$p")
    compgen -G "$dest/$p*.whl" > /dev/null || missing+=("$pin")
done
for file in "$dest"/*.whl; do
    [[ -e "$file" ]] || continue
    base=$(basename "$file" | tr 'A-Z' 'a-z')
    ok=0
    for p in "${keep[@]}"; do [[ "$base" == "$p"* ]] && ok=1 && break; done
    if (( ! ok )); then echo "gpu_wheelhouse: removing $file (not pinned here)"; rm -f "$file"; fi
done
if (( ${#missing[@]} )); then
    echo "gpu_wheelhouse: downloading ${missing[*]}"
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
        --abi "cp${version/./}" --abi abi3 --abi none "${plat[@]}" -d "$dest" "${missing[@]}"
fi
for pin in $PINS; do
    compgen -G "$dest/$(prefix "$pin")*.whl" > /dev/null || { echo "gpu_wheelhouse: no wheel for $pin" >&2; exit 1; }
done
echo "gpu_wheelhouse: $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
