"""LocalAI's own distributed protocol without processes: the load options and hostfiles
that name a group, whether a LoadModel joins one (load options, the command line, an
inherited MLX_DISTRIBUTED_HOSTFILE, the folder LocalAI installed the backend as), and the
refusal of `local-ai worker p2p-mlx`. Real workers and groups:
tests/distributed/test_worker_protocol.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers import write_hostfile

import backend_pb2
import params
from distributed import group as joining
from distributed import worker


# ------------------------------------------------------------------ without processes
def test_load_options_name_the_group_and_are_validated():
    p = params.load_params(
        backend_pb2.ModelOptions(Options=["hostfile: /etc/h.json", "distributed_backend:JACCL"])
    )
    assert (p.hostfile, p.distributed_backend) == ("/etc/h.json", "jaccl")
    assert params.load_params(backend_pb2.ModelOptions()).hostfile == ""
    with pytest.raises(ValueError, match="distributed_backend must be one of ring, jaccl"):
        params.load_params(backend_pb2.ModelOptions(Options=["distributed_backend:mpi"]))
    with pytest.raises(ValueError, match="option hostfile needs a file path"):
        params.load_params(backend_pb2.ModelOptions(Options=["hostfile:"]))


def test_hostfiles_are_checked_before_any_rank_waits(tmp_path):
    ring = write_hostfile(tmp_path, 3)
    spec = joining.group_spec(str(ring), "ring", 2)
    assert (spec.size, spec.rank, spec.backend) == (3, 2, "ring")
    with pytest.raises(ValueError, match=r"rank 3 is outside hostfile .* ranks 0\.\.2"):
        joining.group_spec(str(ring), "ring", 3)
    with pytest.raises(ValueError, match="cannot read hostfile"):
        joining.group_spec(str(tmp_path / "missing.json"), "ring", 1)
    bad = tmp_path / "bad.json"
    bad.write_text('{"hosts": 1}')
    with pytest.raises(ValueError, match='JSON array of "ip:port" strings'):
        joining.group_spec(str(bad), "ring", 1)
    with pytest.raises(ValueError, match="square JSON matrix"):
        joining.group_spec(str(ring), "jaccl", 1)
    jaccl = tmp_path / "devices.json"
    jaccl.write_text(json.dumps([[None, "rdma_en2"], ["rdma_en2", None]]))
    assert joining.group_spec(str(jaccl), "jaccl", 1, "10.0.0.1:5555").coordinator
    one = tmp_path / "one.json"
    one.write_text('["127.0.0.1:5555"]')
    with pytest.raises(ValueError, match="at least 2"):
        joining.group_spec(str(one), "ring", 0)
    with pytest.raises(ValueError, match="must be one of ring, jaccl"):
        joining.group_spec(str(ring), "mpi", 1)


# ------------------------------------------------------------------ does a LoadModel join?
def _decide(*options: str, **start: str) -> worker.JoinDecision:
    load = params.load_params(backend_pb2.ModelOptions(Options=list(options)))
    return worker.decide(load, worker.StartSettings(**start))


def test_an_inherited_hostfile_alone_does_not_make_a_load_join():
    """`local-ai run --p2p` exports MLX_DISTRIBUTED_HOSTFILE to every backend it starts."""
    decision = _decide(env_hostfile="/tmp/localai_mlx_hostfile.json", installed_as="cpu-mlx")
    assert decision.hostfile == "" and "is ignored" in decision.source
    assert _decide().hostfile == ""
    # Installed as LocalAI's mlx-distributed, the variable names the group (as upstream's).
    decision = _decide(env_hostfile="/h.json", installed_as="cpu-mlx-distributed")
    assert decision.hostfile == "/h.json" and "mlx-distributed" in decision.source


def test_load_options_and_the_command_line_ask_for_a_group():
    decision = _decide("hostfile:/a.json", env_hostfile="/env.json", hostfile="/flag.json")
    assert (decision.hostfile, decision.backend) == ("/a.json", "ring")
    assert decision.source == "load option hostfile"
    decision = _decide(hostfile="/flag.json", backend="jaccl", coordinator="10.0.0.1:5556")
    assert (decision.hostfile, decision.backend) == ("/flag.json", "jaccl")
    assert decision.coordinator == "10.0.0.1:5556" and "--hostfile" in decision.source
    decision = _decide("distributed_backend:ring", env_hostfile="/env.json", env_backend="jaccl")
    assert (decision.hostfile, decision.backend) == ("/env.json", "ring")
    assert "option distributed_backend" in decision.source
    assert _decide("distributed_backend:ring").hostfile == ""  # names no group: one process


def test_the_backend_is_recognised_as_mlx_distributed_by_its_folder(tmp_path):
    installed = tmp_path / "cpu-mlx-distributed"
    installed.mkdir()
    assert worker.installed_as(installed) == "cpu-mlx-distributed"
    plain = tmp_path / "mlx"
    plain.mkdir()
    link = tmp_path / "mlx-distributed"
    link.symlink_to(plain)
    assert worker.installed_as(plain, str(link)) == "mlx-distributed"  # libbackend.sh: $PWD
    assert worker.installed_as(plain, str(tmp_path)) == "mlx"  # started from elsewhere
    assert worker.StartSettings(installed_as="mlx-distributed-development").as_mlx_distributed
    assert not worker.StartSettings(installed_as="metal-mlx").as_mlx_distributed


class _Engine:
    """What JoinOnLoad needs of an engine here: load, and status to forward."""

    def __init__(self) -> None:
        self.loads: list = []

    async def load(self, load_params) -> None:
        self.loads.append(load_params)

    def status(self) -> str:
        return "READY"


def test_rank_0_owns_its_engine_and_an_inherited_hostfile_leaves_it_alone(tmp_path):
    engine = _Engine()
    start = worker.StartSettings(env_hostfile=str(write_hostfile(tmp_path, 2)), installed_as="mlx")
    rank0 = worker.JoinOnLoad(start, engine=engine)
    load = params.load_params(backend_pb2.ModelOptions(Model="m"))
    asyncio.run(rank0.load(load))
    assert engine.loads == [load]  # loaded alone: no join was attempted
    assert rank0.coordinator is None and rank0.joiner.spec is None
    assert rank0.status() == "READY"  # the servicer's other calls reach the engine
    assert not hasattr(worker.JoinOnLoad, "__getattr__")  # only what it names, forwarded


def test_the_p2p_mlx_refusal_says_what_to_run_instead():
    message = worker.rank_zero_worker_message("/etc/hosts.json")
    assert "rank 0 serves gRPC and is not a worker" in message
    assert "local-ai worker p2p-mlx" in message
    assert "local-ai worker mlx-distributed --hostfile /etc/hosts.json --rank N" in message
