"""Programs that talk to a running backend: ``cli`` (the command-line client) and
``server_process`` (a backend process on a free port, the harness of tests and benchmarks).
"""
