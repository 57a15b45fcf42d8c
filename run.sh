#!/usr/bin/env bash
# Entry point LocalAI spawns: `run.sh --addr HOST:PORT` (extra args may come first).
# Two layouts:
#  * Inside LocalAI's tree (backend/python/<name>/ next to common/, or common/ copied into
#    this directory as LocalAI's images do): libbackend.sh's startBackend execs
#    venv/bin/python backend.py, as for LocalAI's own backends (install.sh made the venv).
#  * Standalone: the project's .venv when present; `exec` so SIGTERM reaches Python directly.
# Either way backend.py makes sure the Linux CPU fast BLAS is preloaded
# (cpu_fast_path.ensure_preloaded); standalone we preload it here, which saves that restart.
backend_dir=$(dirname "$0")
for lib in "$backend_dir/common/libbackend.sh" "$backend_dir/../common/libbackend.sh"; do
  if [ -f "$lib" ]; then
    # shellcheck source=/dev/null
    source "$lib"
    startBackend "$@"
    echo "run.sh: libbackend.sh's startBackend found no backend.py to start" >&2
    exit 1
  fi
done

set -euo pipefail
cd "$backend_dir"
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if [ ! -f backend_pb2.py ] || [ backend.proto -nt backend_pb2.py ]; then
  "$PY" -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. backend.proto
fi
# Linux CPU: preload the MKL from requirements-cpu.txt so MLX's float32 matmuls skip the
# reference BLAS bundled in the mlx[cpu] wheel (~30x faster). Prints nothing when it is not
# installed, off Linux, or with LOCALAI_MLX_BLAS=none; never stops the start.
if [ "$(uname -s)" = Linux ]; then
  eval "$("$PY" -m loading.cpu_fast_path --exports 2>/dev/null || true)"
fi
exec "$PY" backend.py "$@"
