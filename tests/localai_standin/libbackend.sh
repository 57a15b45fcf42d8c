#!/usr/bin/env bash
# Stand-in for LocalAI's backend/python/common/libbackend.sh, for tests: the same functions
# with the same behaviour (build profile from BUILD_TYPE / CUDA_MAJOR_VERSION, venv/ next to
# the backend, requirement files in LocalAI's order, protoc with `-I../../ -I./`, `exec
# venv/bin/python backend.py "$@"`, `python -m unittest test.py`), but offline and fast:
#  * the venv reuses the packages of STANDIN_SITE_PACKAGES through a .pth file;
#  * "installing" a requirement file checks that the venv already satisfies it (no network);
#    STANDIN_DRY_RUN=1 only lists the files.
# Every requirement file it reads is logged as "requirements file: PATH".
set -euo pipefail

function getBuildProfile() {
    if [ "x${BUILD_TYPE:-}" == "xcublas" ] || [ "x${BUILD_TYPE:-}" == "xl4t" ]; then
        echo "${BUILD_TYPE}${CUDA_MAJOR_VERSION:-}"
    elif [ -d "/opt/intel" ]; then
        echo intel
    elif [ -n "${BUILD_TYPE:-}" ]; then
        echo "${BUILD_TYPE}"
    else
        echo cpu
    fi
}

function init() {
    BACKEND_NAME=${PWD##*/}
    MY_DIR=$(realpath "$(dirname "$0")")
    BUILD_PROFILE=$(getBuildProfile)
    EDIR=${ENV_DIR:-${MY_DIR}}
}

function ensureVenv() {
    if [ ! -d "${EDIR}/venv" ]; then
        "${STANDIN_PYTHON:-python3}" -m venv --without-pip "${EDIR}/venv"
        local site
        site=$("${EDIR}/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "${STANDIN_SITE_PACKAGES}" > "${site}/standin-shared.pth"
    fi
    export VIRTUAL_ENV="${EDIR}/venv"
    export PATH="${EDIR}/venv/bin:${PATH}"
    unset PYTHONHOME
}

# Checks, without a network, that the venv satisfies one requirement file.
function _checkRequirements() {
    python - "$1" <<'PY'
import importlib.metadata as md, sys
from packaging.requirements import Requirement
missing = []
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line or line.startswith("-"):
        continue
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate():
        continue
    try:
        version = md.version(req.name)
    except md.PackageNotFoundError:
        missing.append(str(req))
        continue
    if not req.specifier.contains(version, prereleases=True):
        missing.append(f"{req} (have {version})")
sys.exit(f"not installed: {', '.join(missing)}" if missing else 0)
PY
}

function runProtogen() {
    ensureVenv
    pushd "${EDIR}" >/dev/null
    rm -f backend_pb2.py backend_pb2_grpc.py
    python -m grpc_tools.protoc -I../../ -I./ --python_out=. --grpc_python_out=. backend.proto
    python -c 'import backend_pb2, backend_pb2_grpc'
    popd >/dev/null
}

function installRequirements() {
    ensureVenv
    local files=("${EDIR}/requirements-install.txt" "${EDIR}/requirements.txt"
        "${EDIR}/requirements-${BUILD_TYPE:-}.txt")
    if [ "x${BUILD_TYPE:-}" != "x${BUILD_PROFILE}" ]; then
        files+=("${EDIR}/requirements-${BUILD_PROFILE}.txt")
    fi
    if [ "x${BUILD_TYPE:-}" == "x" ]; then
        files+=("${EDIR}/requirements-cpu.txt")
    fi
    files+=("${EDIR}/requirements-after.txt")
    if [ "x${BUILD_TYPE:-}" != "x${BUILD_PROFILE}" ]; then
        files+=("${EDIR}/requirements-${BUILD_PROFILE}-after.txt")
    fi
    for reqFile in "${files[@]}"; do
        if [ -f "${reqFile}" ]; then
            echo "requirements file: ${reqFile}"
            if [ "${STANDIN_DRY_RUN:-0}" != 1 ]; then
                _checkRequirements "${reqFile}"
            fi
        fi
    done
    if [ "${STANDIN_DRY_RUN:-0}" != 1 ]; then
        runProtogen
    fi
}

function startBackend() {
    ensureVenv
    if [ -e "${MY_DIR}/backend.py" ]; then
        exec "${EDIR}/venv/bin/python" "${MY_DIR}/backend.py" "$@"
    fi
}

function runUnittests() {
    ensureVenv
    pushd "${MY_DIR}" >/dev/null
    python -m unittest test.py
    popd >/dev/null
}

init
