#!/usr/bin/env python3
"""LocalAI MLX backend: the script LocalAI starts (``python backend.py --addr HOST:PORT``).

LocalAI's ``libbackend.sh`` ``startBackend`` runs ``server.py`` if the backend folder has
one, else ``backend.py``: so start-up lives in ``edge/startup.py``, never in a root
``server.py``. The request path, top-down: ``edge/`` (gRPC servicer, start-up) ->
``params.py`` (the parsing layer) -> ``engine/`` (the MLX thread and its scheduler) ->
``decoding/`` (sampling, output pipeline) with ``prompt_cache.py`` + ``caches/`` beside it.
"""

if __name__ == "__main__":
    # Before anything loads MLX: restart with the fast BLAS preloaded, whoever started us.
    from loading import cpu_fast_path

    cpu_fast_path.ensure_preloaded()

    from edge import startup

    startup.main()
