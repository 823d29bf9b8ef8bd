#!/usr/bin/env bash
# Set up gravac's virtual environment: torch, the pinned requirements, and Horovod built
# from its PyPI source against that torch (PyTorch + Gloo, MPI/NCCL when present).
#
# Usage:   hvd_scripts/install.sh            (from anywhere; safe to re-run)
# Env:     PYTHON=python3.11                 interpreter used to create the venv
#          GRAVAC_VENV=/path/.venv           venv location (default: <repo>/.venv)
#          GRAVAC_CACHE=~/.cache/gravac      where built Horovod wheels are cached
#          GRAVAC_REBUILD_HOROVOD=1          ignore the cached wheel and build again
#
# The first run builds Horovod (4-8 minutes on 2 cores); later runs reuse the wheel
# cached under $GRAVAC_CACHE/wheels/, keyed by Horovod, torch, Python and build features.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
VENV=${GRAVAC_VENV:-$repo/.venv}
CACHE=${GRAVAC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gravac}
REQ=$repo/requirements.txt

say() { echo "[install] $*"; }
die() { echo "[install] ERROR: $*" >&2; exit 1; }

pin() {  # version pinned for package $1 in requirements.txt
    local v
    v=$(grep -iE "^$1==" "$REQ" | head -n 1 | cut -d= -f3 | tr -d '[:space:]')
    [ -n "$v" ] || die "requirements.txt has no pin for '$1' (expected a line '$1==VERSION')"
    echo "$v"
}
TORCH_VERSION=$(pin torch)
HOROVOD_VERSION=$(pin horovod)

command -v "$PYTHON" >/dev/null || die "'$PYTHON' not found; set PYTHON=/path/to/python3.11"

# 1. Virtual environment ------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtual environment $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY=$VENV/bin/python
PIP=("$PY" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip>=23" "setuptools>=68" wheel

# 2. torch first, exactly the pinned build ------------------------------------------------
installed_torch=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [ "${installed_torch%%+*}" != "$TORCH_VERSION" ]; then
    say "installing torch==$TORCH_VERSION"
    "${PIP[@]}" install -q "torch==$TORCH_VERSION"
fi
torch_full=$("$PY" -c 'import torch; print(torch.__version__)')

# 3. Everything else, with torch held at its pin so nothing pulls a newer (CUDA) build ----
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_full" >"$constraints"
grep -viE '^(torch|horovod|triton)==' "$REQ" | "${PIP[@]}" install -q -c "$constraints" -r /dev/stdin

# 3a. PyTorch Lightning and Accelerate (requirements-frameworks.txt), for the examples and
# tests that plug gravac's DDP communication hook into them; gravac itself does not need
# them. Constraints: the installed torch build and the other pins of requirements.txt, so
# that nothing here moves torch or a pin (not Triton's: a CUDA torch requires its own).
FW_REQ=$repo/requirements-frameworks.txt
echo "torch==$torch_full" >"$constraints"
grep -viE '^(torch|horovod|triton)==' "$REQ" >>"$constraints"
"${PIP[@]}" install -q -c "$constraints" -r "$FW_REQ" \
    || die "installing $FW_REQ failed (pip's error above); it is resolved with" \
           "torch==$torch_full and the pins of requirements.txt as constraints, and a" \
           "version there that conflicts with one of them is the usual cause"

# 3b. Triton, only where none is importable: a CUDA torch brings the Triton it was built
# with (never replace that one); on a CPU torch the pinned one lets the tests run gravac's
# GPU kernels in Triton's interpreter. Its wheels are for Linux x86_64 and aarch64 only.
if ! "$PY" -c 'import triton' 2>/dev/null; then
    case "$(uname -s)-$(uname -m)" in
        Linux-x86_64|Linux-aarch64)
            say "installing triton==$(pin triton) (its interpreter tests the GPU kernels on CPU)"
            "${PIP[@]}" install -q --no-deps "triton==$(pin triton)" ;;
        *) say "no Triton wheel for $(uname -s)-$(uname -m): its CPU tests will be skipped" ;;
    esac
fi

# 4. Horovod, from the cache or built from source ----------------------------------------
py_tag=$("$PY" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
features=gloo
with_mpi=0
with_nccl=0
if command -v mpicc >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1; then
    features+=-mpi; with_mpi=1
fi
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.version.cuda else 1)' 2>/dev/null \
   && { ldconfig -p 2>/dev/null | grep -q libnccl || [ -n "${NCCL_HOME:-}" ]; }; then
    features+=-nccl; with_nccl=1
fi
key="horovod-${HOROVOD_VERSION}_torch-${torch_full}_${py_tag}_${features}"
wheel_dir=$CACHE/wheels/$key

horovod_ok() {  # the installed horovod imports against this torch, right version
    "$PY" - "$HOROVOD_VERSION" <<'EOF' 2>/dev/null
import sys
import horovod, horovod.torch  # noqa: F401  (import fails if built against another torch)
sys.exit(0 if horovod.__version__ == sys.argv[1] else 1)
EOF
}

if [ "${GRAVAC_REBUILD_HOROVOD:-0}" = 1 ]; then
    rm -rf "$wheel_dir"
fi
if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    say "building Horovod $HOROVOD_VERSION from source ($features); this takes 4-8 minutes on 2 cores"
    command -v cmake >/dev/null || die "cmake is needed to build Horovod (apt-get install cmake)"
    real_cxx=${CXX:-$(command -v g++ || command -v c++ || true)}
    [ -n "$real_cxx" ] || die "no C++ compiler found (apt-get install g++)"
    build=$(mktemp -d)
    trap 'rm -f "$constraints"; rm -rf "$build"' EXIT
    # Horovod 0.28.1 asks CMake for C++14, which torch 2.x headers reject, and strips -std=
    # from CXXFLAGS; a compiler wrapper that appends -std=c++17 (the last -std wins) is the
    # one hook its build leaves us. CMake also hands this compiler to nvcc as host compiler.
    cat >"$build/cxx17" <<EOF
#!/bin/sh
exec "$real_cxx" "\$@" -std=c++17
EOF
    chmod +x "$build/cxx17"
    # Cloudpickle, psutil, pyyaml and packaging are Horovod's run-time deps (installed above).
    env CXX="$build/cxx17" \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        $( [ $with_mpi = 1 ] && echo HOROVOD_WITH_MPI=1 || echo HOROVOD_WITHOUT_MPI=1 ) \
        $( [ $with_nccl = 1 ] && echo HOROVOD_GPU_OPERATIONS=NCCL ) \
        MAKEFLAGS="-j$(nproc)" \
        "${PIP[@]}" wheel --no-build-isolation --no-deps --no-binary horovod \
            -w "$build/wheel" "horovod==$HOROVOD_VERSION" >"$build/build.log" 2>&1 \
        || { tail -n 60 "$build/build.log" >&2; die "Horovod build failed (log above)"; }
    mkdir -p "$CACHE/wheels"
    # Publish atomically so an interrupted build never leaves a half-written cache entry.
    staging=$(mktemp -d "$CACHE/wheels/.staging.XXXXXX")
    cp "$build"/wheel/horovod-*.whl "$staging"/
    rm -rf "$wheel_dir"
    mv "$staging" "$wheel_dir"
    say "cached the Horovod wheel in $wheel_dir"
fi
if ! horovod_ok; then
    say "installing Horovod from $wheel_dir"
    "${PIP[@]}" install -q --force-reinstall --no-deps "$wheel_dir"/horovod-*.whl
fi

# 5. gravac itself, editable, so `import gravac` works from any directory -------------
"${PIP[@]}" install -q --no-deps --no-build-isolation -e "$repo"
# its one C kernel (gravac/native/scan.c), built ahead so that no run pays for it; where it
# cannot be built gravac takes NumPy instead (same results, slower selection)
if native=$("$VENV/bin/python" -c "from gravac import native; print(native.build())" 2>&1); then
    say "built gravac's native kernel: $native"
else
    say "WARNING: gravac's native kernel could not be built, NumPy is used instead: ${native##*$'\n'}"
fi

# 6. sshd for the multi-host sandbox (hvd_scripts/cluster_sandbox.sh, tests/cluster) -------
# Optional: without it the cluster tests are skipped, so this never fails the install. As
# root on Debian/Ubuntu it is one package; where systemd runs, its postinst also starts the
# system's sshd on port 22 (the sandbox does not need that one: `systemctl disable --now
# ssh` stops it).
if ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing openssh-server (sshd, for hvd_scripts/cluster_sandbox.sh)"
        apt_log=$(mktemp)
        # a machine whose package lists were never fetched needs `apt-get update` first
        if DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server >"$apt_log" 2>&1 \
           || { apt-get update -q >>"$apt_log" 2>&1 &&
                DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server >>"$apt_log" 2>&1; }; then
            say "installed openssh-server"
        else
            say "WARNING: could not install openssh-server ($(tail -n 1 "$apt_log")); the cluster tests will be skipped"
        fi
        rm -f "$apt_log"
    else
        say "WARNING: sshd not found: the multi-host sandbox (hvd_scripts/cluster_sandbox.sh) and tests/cluster need it; as root: apt-get install -y openssh-server"
    fi
fi

# 7. Check the build: PyTorch and Gloo must be there ---------------------------------------
check=$("$VENV/bin/horovodrun" --check-build 2>&1) || die "horovodrun --check-build failed: $check"
echo "$check"
echo "$check" | grep -qE '\[X\] PyTorch' || die "Horovod was built without PyTorch support"
echo "$check" | grep -qE '\[X\] Gloo' || die "Horovod was built without Gloo support"
say "done: activate with 'source $VENV/bin/activate'"
