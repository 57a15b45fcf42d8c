#!/usr/bin/env bash
# Entry point LocalAI spawns: `run.sh --addr HOST:PORT` (extra args may come first).
# Uses the project's venv when present; `exec` so SIGTERM reaches Python directly.
set -euo pipefail
cd "$(dirname "$0")"
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if [ ! -f backend_pb2.py ] || [ backend.proto -nt backend_pb2.py ]; then
  "$PY" -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. backend.proto
fi
# Linux CPU: preload the MKL from requirements-cpu.txt so MLX's float32 matmuls skip the
# reference BLAS bundled in the mlx[cpu] wheel (~30x faster). Prints nothing when it is not
# installed, off Linux, or with LOCALAI_MLX_BLAS=none; never stops the start.
if [ "$(uname -s)" = Linux ]; then
  eval "$("$PY" cpu_fast_path.py --exports 2>/dev/null || true)"
fi
exec "$PY" backend.py "$@"
