#!/usr/bin/env python3
"""LocalAI MLX backend: the script LocalAI starts (``python backend.py --addr HOST:PORT``).

The servicer is ``servicer.py``; start-up (arguments, server, signals) is ``server.py``.
"""

if __name__ == "__main__":
    # Before anything loads MLX: restart with the fast BLAS preloaded, whoever started us.
    import cpu_fast_path

    cpu_fast_path.ensure_preloaded()

    import server

    server.main()
