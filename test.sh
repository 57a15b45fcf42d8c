#!/usr/bin/env bash
# Run test.py (unittest: a real server on the embedded model), as LocalAI's backends do.
#  * Inside LocalAI's tree: libbackend.sh's runUnittests (`python -m unittest test.py` in venv/).
#  * Standalone: the same with the project's .venv (the full suite is `make test`).
set -e
backend_dir=$(dirname "$0")
for lib in "$backend_dir/common/libbackend.sh" "$backend_dir/../common/libbackend.sh"; do
  if [ -f "$lib" ]; then
    # shellcheck source=/dev/null
    source "$lib"
    runUnittests
    exit 0
  fi
done

cd "$backend_dir"
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
if [ ! -f backend_pb2.py ] || [ backend.proto -nt backend_pb2.py ]; then
  "$PY" -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. backend.proto
fi
exec "$PY" -m unittest test.py
