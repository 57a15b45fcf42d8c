"""The request edge: the gRPC side of the backend, and nothing of MLX.

- ``startup``: arguments, the ``grpc.aio`` server, health + reflection, signals, graceful stop
  (``backend.py`` runs ``startup.main``).
- ``servicer``: one short adapter per RPC (proto in -> ``params`` -> engine call -> proto out)
  and the one mapping of domain errors to gRPC status.
- ``replies``: engine events -> ``Reply`` messages (Predict joins what PredictStream sends).
- ``interceptors``: bearer-token auth and request-decoding errors.
- ``lifecycle``: log levels from the environment, the parent-process watch, shutdown helpers.
"""
