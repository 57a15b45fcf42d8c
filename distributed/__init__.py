"""Distributed mode: one model served by a group of processes, driven by rank 0.

Two ways to start a group: MLX's launcher (``mlx.launch ... run.sh --distributed
tensor|pipeline``; every rank joins at start) or LocalAI's worker protocol (``local-ai
worker mlx-distributed``: workers started alone with ``--worker``, rank 0 joining at
LoadModel). Either way rank 0 serves gRPC and runs the usual ``Engine`` with a
``Coordinator`` as its ``GroupHooks``; once per engine iteration it sends the other
ranks a typed step plan, and they run the same batch on their part of the model.

What lives where:

- ``plan.py``: the step plan's typed values (``Join``, ``Leave``, ``Call``, ``Plan``)
  and their wire form; no MLX.
- ``group.py``: joining a group: ``init_group`` (``mlx.launch``), ``GroupSpec`` /
  ``group_spec`` (hostfiles), the rendezvous, ``Joiner``, LocalAI's environment names,
  the join timeout; MLX only when joining.
- ``collectives.py``: ``Collectives``, the group's MLX collectives (step plans, load
  agreements, one shared integer) and its failure (``GroupLost``); used by the
  coordinator and by the split step alike.
- ``coordinator.py``: ``Coordinator``, rank 0's ``GroupHooks`` (plans, replicated
  calls, loads), the watchdog.
- ``lifeline.py``: one idle TCP connection from every rank to rank 0, so a rank that
  dies fails the group at once (MLX's own error can wait behind a large collective).
- ``sharding.py``: splitting a model (``check_split``, tensor / pipeline, the
  vocabulary-parallel embedding, sharded dequantizing) and loading each rank's part
  through the one loader (``ShardStep``, the loader's split step).
- ``follower.py``: the other ranks: ``follow`` applies rank 0's plans (shadow jobs,
  ``FollowerPromptCache``, ``Desync``).
- ``worker.py``: LocalAI's worker protocol: ``decide`` (does a LoadModel join a group,
  and which setting said so), ``JoinOnLoad`` (rank 0: owns an ``Engine``, joins at
  LoadModel), ``run_worker`` (ranks 1..N-1).

The engine never imports this package; ``edge/startup.py`` builds the roles. Importing
a submodule other than ``plan`` or ``group`` imports MLX.
"""
