"""Linux CPU fast path: an optimized BLAS under MLX, and the dequantize-to-float32 mode.

Owns two things the engine and ``run.sh`` need on a CPU-only Linux host:

* **Which BLAS MLX uses.** The ``mlx[cpu]`` wheel links a bundled *reference* BLAS
  (float32 1024³ matmul ~0.4-0.5 s, ~4 GFLOP/s). ``libmlx.so`` imports ``cblas_sgemm`` and
  the LAPACK routines as undefined dynamic symbols, so a library named in ``LD_PRELOAD``
  that exports the standard names is bound first. ``requirements-cpu.txt`` installs Intel
  MKL from PyPI (see the comment there for why MKL and not an OpenBLAS wheel);
  ``blas_library_path`` finds it without importing MLX (``run.sh`` calls it at every
  start), ``preload_env`` builds the environment to start the server with, and
  ``check_blas`` says, from inside a running process, which library really serves
  ``cblas_sgemm`` and how fast. ``ensure_preloaded`` (first thing in ``backend.py``'s
  ``__main__``) re-executes a process started without the preload (``python backend.py``,
  as LocalAI's ``libbackend.sh`` does), so the fast path holds whoever starts us.
* **The CPU weight mode.** MLX's CPU quantized matmul is slow (~1.4 GMAC/s); with a fast
  BLAS a model dequantized to float32 prefills ~13x and decodes ~1.3x faster
  (BENCHMARKS.md, section E). ``choose_cpu_mode`` decides ("dense" or
  "quantized") from the ``cpu_dequantize`` option, the device and a memory budget;
  ``prepare_for_cpu`` is the one call the engine makes after loading a model.

Importing this module is cheap (standard library only); MLX is imported inside the
functions that need it. Functions that touch MLX arrays must run on the engine's MLX thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import shlex
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loading import host_memory
from parsing.options import AUTO_WORDS, OFF_WORDS, on_off

if TYPE_CHECKING:
    import mlx.nn as nn

logger = logging.getLogger("localai.mlx.cpu_fast_path")

#: Environment variable overriding the BLAS to preload: unset/"auto" = the MKL that
#: requirements-cpu.txt installs; "none"/"off"/"0" = preload nothing (bundled BLAS);
#: anything else = path of a shared library exporting the standard ``cblas_*`` names.
BLAS_ENV = "LOCALAI_MLX_BLAS"

#: ``cpu_dequantize_budget``'s default: this share of physical (or cgroup-limited) RAM,
#: what the float32 copy of a model may take before "auto" keeps it quantized.
DEQUANTIZE_SHARE = 0.5
MIB = 1024 * 1024

#: A float32 matmul at or above this rate (GFLOP/s) counts as a fast BLAS. The bundled
#: reference BLAS reaches ~4 GFLOP/s; MKL or OpenBLAS reach 100-240 on 2 cores here.
FAST_GFLOPS = 20.0

# Thread settings that go with the MKL preload; values already in the environment win.
# INTEL threading uses the libiomp5 preloaded with it (from the intel-openmp wheel, so
# nothing from the system); LP64 because MLX passes 32-bit integers to BLAS/LAPACK.
_MKL_ENV = {"MKL_THREADING_LAYER": "INTEL", "MKL_INTERFACE_LAYER": "LP64"}


_warned_slow = False
_load_report: BlasReport | None = None  # prepare_for_cpu's check, once per process


@dataclass(frozen=True)
class BlasReport:
    """What ``check_blas`` measured.

    ``library``: path (or description) of the library that serves ``cblas_sgemm`` for
    MLX in this process. ``gflops``: float32 matmul rate on the CPU stream, GFLOP/s (best
    of a few runs). ``fast``: ``gflops >= FAST_GFLOPS``.
    """

    library: str
    gflops: float
    fast: bool


# --------------------------------------------------------------------------- BLAS


def _mkl_libraries() -> list[Path] | None:
    """[libiomp5, libmkl_rt] from the pip wheels ``intel-openmp`` and ``mkl``, or None."""
    # pip puts these wheels' libraries in <prefix>/lib: look there first, since importing
    # importlib.metadata costs ~75 ms of every run.sh start.
    lib = Path(sys.prefix) / "lib"
    iomp, mkl = lib / "libiomp5.so", sorted(lib.glob("libmkl_rt.so.*"))
    if iomp.is_file() and mkl:
        return [iomp.resolve(), mkl[-1].resolve()]
    import importlib.metadata

    found: list[Path] = []
    for dist, pattern in (("intel-openmp", r"libiomp5\.so$"), ("mkl", r"libmkl_rt\.so(\.\d+)*$")):
        try:
            files = importlib.metadata.files(dist) or []
        except importlib.metadata.PackageNotFoundError:
            return None
        paths = [f for f in files if re.search(pattern, f.name)]
        if not paths:
            return None
        path = Path(paths[0].locate()).resolve()
        if not path.is_file():
            return None
        found.append(path)
    return found


def _preload_libraries() -> list[Path]:
    """Libraries to put in LD_PRELOAD, in order (runtime first); empty when none apply."""
    if not sys.platform.startswith("linux"):
        return []
    override = os.environ.get(BLAS_ENV, "auto").strip()
    if override.lower() in ("none", *OFF_WORDS):
        return []
    if override.lower() not in AUTO_WORDS:
        path = Path(override).expanduser()
        if not path.is_file():
            logger.warning("%s=%s is not a file; using the bundled BLAS", BLAS_ENV, override)
            return []
        return [path.resolve()]
    return _mkl_libraries() or []


def blas_library_path() -> Path | None:
    """The installed fast BLAS shared library to preload, or None.

    None on anything but Linux, when ``LOCALAI_MLX_BLAS`` disables it, or when the MKL
    wheel from ``requirements-cpu.txt`` is not installed. Uses only package metadata: no
    MLX import, so it is cheap enough for ``run.sh`` to call at every start.
    """
    libraries = _preload_libraries()
    return libraries[-1] if libraries else None


def preload_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` that makes a process started with it run MLX on the fast BLAS.

    Prepends the BLAS (and its OpenMP runtime) to ``LD_PRELOAD`` and adds the MKL thread
    settings that are not already set. Idempotent: libraries already listed are not added
    again. Returns an unchanged copy when ``blas_library_path()`` is None.
    """
    out = dict(env)
    libraries = _preload_libraries()
    if not libraries:
        return out
    current = out.get("LD_PRELOAD", "").replace(":", " ").split()
    new = [str(p) for p in libraries if str(p) not in current]
    out["LD_PRELOAD"] = " ".join(new + current)
    if any(p.name.startswith("libmkl_rt") for p in libraries):
        for key, value in _MKL_ENV.items():
            out.setdefault(key, value)
    return out


def shell_exports(env: Mapping[str, str] | None = None) -> str:
    """``export K=V`` lines (shell-quoted) for what ``preload_env`` adds or changes."""
    base = dict(os.environ if env is None else env)
    wanted = preload_env(base)
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in wanted.items() if base.get(k) != v)


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _global_provider(symbol: str) -> str | None:
    """Path of the library whose ``symbol`` the global scope (main program + preloads) binds.

    libmlx.so resolves its undefined ``cblas_sgemm`` against the global scope before its
    own dependencies, so a provider found here is the one MLX calls.
    """
    try:
        process = ctypes.CDLL(None)
        address = ctypes.cast(getattr(process, symbol), ctypes.c_void_p).value
        dladdr = process.dladdr
    except (AttributeError, OSError):
        return None
    info = _DlInfo()
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    if not address or not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)


def _mapped_libraries(pattern: str) -> list[str]:
    """Paths of mapped shared objects whose file name matches ``pattern`` (Linux only)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if re.search(pattern, p.rsplit("/", 1)[-1]))


def _blas_in_use() -> str:
    provider = _global_provider("cblas_sgemm")
    if provider:
        return provider
    bundled = _mapped_libraries(r"^libblas")
    if bundled:
        return bundled[0]
    return "bundled with MLX" if sys.platform.startswith("linux") else "system (Accelerate)"


_FAST_LIBRARIES = ("libmkl_rt", "libopenblas", "accelerate")


def known_fast_library(library: str) -> bool:
    """True when ``library`` (a path or name) is an optimized BLAS: MKL, OpenBLAS, Accelerate."""
    name = os.path.basename(library).lower()
    return any(name.startswith(prefix) for prefix in _FAST_LIBRARIES)


def check_blas(size: int = 512) -> BlasReport:
    """Measure the float32 ``size``×``size`` matmul on MLX's CPU stream; name the BLAS.

    Best of 3 timed runs after one warm-up (size 512: ~0.2 s on the reference BLAS,
    ~10 ms on MKL). Logs a warning once per process when the result is not fast and the
    default device is the CPU. Run it on the MLX thread. Raises ``ValueError`` for
    ``size < 1``.
    """
    global _warned_slow
    if size < 1:
        raise ValueError(f"check_blas size must be >= 1, got {size}")
    import mlx.core as mx

    a = mx.random.uniform(shape=(size, size), dtype=mx.float32, stream=mx.cpu)
    b = mx.random.uniform(shape=(size, size), dtype=mx.float32, stream=mx.cpu)
    mx.eval(a, b)
    mx.eval(mx.matmul(a, b, stream=mx.cpu))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        mx.eval(mx.matmul(a, b, stream=mx.cpu))
        best = min(best, time.perf_counter() - start)
    gflops = 2.0 * size**3 / max(best, 1e-9) / 1e9
    library = _blas_in_use()
    # A timing alone misjudges a loaded host (MKL measured 6 GFLOP/s once at load 15):
    # a known optimized library serving cblas_sgemm counts as fast whatever it timed.
    fast = gflops >= FAST_GFLOPS or known_fast_library(library)
    report = BlasReport(library=library, gflops=gflops, fast=fast)
    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    if not report.fast and on_cpu and not _warned_slow:
        _warned_slow = True
        logger.warning(
            "MLX float32 matmul runs at %.1f GFLOP/s on %s: no fast BLAS is loaded. "
            "Start the backend through run.sh (it preloads MKL from requirements-cpu.txt) "
            "or set LD_PRELOAD to an OpenBLAS/MKL library exporting cblas_sgemm.",
            report.gflops,
            report.library,
        )
    return report


# --------------------------------------------------------------------------- mode


def _parse_option(option: str | bool | None) -> bool | None:
    """True = dense, False = quantized, None = auto. Raises ValueError naming the option."""
    try:
        return on_off(option, None, ("dense", "quantized"))
    except ValueError:
        raise ValueError(f"cpu_dequantize must be auto, true or false; got {option!r}") from None


def choose_cpu_mode(
    option: str | bool | None,
    *,
    device_type: str,
    quantized: bool,
    float32_bytes: int,
    budget_bytes: int,
    fast_blas: bool = True,
) -> str:
    """Return "dense" (float32 weights) or "quantized" (weights kept as loaded).

    ``option`` is the ``cpu_dequantize`` model option: "auto"/None (default), True/"true"
    or False/"false" (also yes/no, on/off, 1/0). Invalid values raise ``ValueError``
    naming ``cpu_dequantize``. On a device other than "cpu" the answer is always
    "quantized": nothing changes on Metal/CUDA. A model that is not quantized is "dense".
    "auto" picks "dense" when ``float32_bytes`` (bytes) fits ``budget_bytes`` (bytes) and
    ``fast_blas`` is true (with the reference BLAS dense decoding is slower than
    quantized); an explicit true is honoured even over budget.
    """
    wanted = _parse_option(option)
    if device_type != "cpu":
        return "quantized"
    if not quantized:
        return "dense"
    if wanted is None:
        return "dense" if fast_blas and float32_bytes <= budget_bytes else "quantized"
    return "dense" if wanted else "quantized"


def default_dequantize_budget() -> int:
    """``cpu_dequantize_budget``'s default: ``DEQUANTIZE_SHARE`` (50%) of the memory this
    process may use (`loading.host_memory.usable_memory`: RAM, or the cgroup limit)."""
    return int(host_memory.usable_memory() * DEQUANTIZE_SHARE)


def _is_quantized(module: nn.Module) -> bool:
    return hasattr(module, "bits") and hasattr(module, "group_size") and "scales" in module


def _quantized_modules(model: nn.Module) -> dict[str, Any]:
    return {name: m for name, m in model.named_modules() if _is_quantized(m)}


def float32_size(model: nn.Module) -> int:
    """Bytes the model's parameters would take dequantized to float32.

    Packed quantized weights count as ``size * 32 / bits`` float32 values; their scales
    and biases disappear; every other parameter counts 4 bytes per element.
    """
    from seam.arrays import flat_arrays

    quantized = _quantized_modules(model)
    total = 0
    for key, array in flat_arrays(model.parameters()):
        owner, _, leaf = key.rpartition(".")
        module = quantized.get(owner)
        if module is None:
            total += array.size * 4
        elif leaf == "weight":
            total += array.size * 32 // module.bits * 4
        elif leaf not in ("scales", "biases"):
            total += array.size * 4
    return total


def dequantize_to_float32(model: nn.Module) -> None:
    """Replace the model's quantized layers by float32 ones, in place.

    Floating parameters (scales, biases, norms) are cast to float32 first: dequantizing
    with float16 scales would round every weight to float16. Evaluates the result.
    """
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model

    model.set_dtype(mx.float32)
    dequantize_model(model)
    mx.eval(model.parameters())


def prepare_for_cpu(
    model: nn.Module,
    option: str | bool | None,
    budget_bytes: int | None = None,
    device: Any = None,
) -> str:
    """Decide and apply the CPU weight mode; return "dense" or "quantized".

    The one call the engine makes after loading, on the MLX thread. ``option``: the
    ``cpu_dequantize`` value (see ``choose_cpu_mode``; invalid raises ``ValueError``).
    ``budget_bytes`` (``cpu_dequantize_budget``) defaults to ``default_dequantize_budget()``;
    ``device`` to MLX's default
    device. On the CPU every floating parameter becomes float32 in both modes (float32
    scales decode faster than float16 there); "dense" also dequantizes. A model that is
    not quantized is cast to float32 only when that fits the budget (or ``option`` is
    true). Other devices: the model is left untouched and "quantized" is returned.
    """
    import mlx.core as mx

    device = mx.default_device() if device is None else device
    device_type = "cpu" if device.type == mx.DeviceType.cpu else "gpu"
    if device_type != "cpu":
        _parse_option(option)
        return "quantized"
    budget = default_dequantize_budget() if budget_bytes is None else budget_bytes
    quantized = bool(_quantized_modules(model))
    needed = float32_size(model)
    wants = _parse_option(option)
    report = _blas_report_for_load() if quantized and wants is not False else None
    mode = choose_cpu_mode(
        option,
        device_type=device_type,
        quantized=quantized,
        float32_bytes=needed,
        budget_bytes=budget,
        fast_blas=report.fast if report else True,
    )
    if mode == "dense" and quantized and needed > budget:
        logger.warning(
            "cpu_dequantize=%s: float32 weights take %.0f MiB, over cpu_dequantize_budget %.0f MiB",
            option,
            needed / MIB,
            budget / MIB,
        )
    if mode == "dense" and quantized:
        dequantize_to_float32(model)
    elif quantized or needed <= budget or wants:
        # A quantized model's floating parameters (scales, norms) are small; a dense
        # float16/bfloat16 model only grows to float32 when that fits the budget.
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())
    logger.info(
        "CPU weight mode %s (cpu_dequantize=%s, quantized=%s, float32 %.0f MiB, "
        "cpu_dequantize_budget %.0f MiB%s)",
        mode,
        option,
        quantized,
        needed / MIB,
        budget / MIB,
        f", BLAS {report.library} {report.gflops:.0f} GFLOP/s" if report else "",
    )
    return mode


def _blas_report_for_load() -> BlasReport:
    """``check_blas()`` once per process: the BLAS cannot change after start."""
    global _load_report
    if _load_report is None:
        _load_report = check_blas()
    return _load_report


def blas_report() -> BlasReport:
    """The BLAS MLX uses in this process (measured once, on first call; ~0.1 s)."""
    return _blas_report_for_load()


#: Set (to the process id) in the environment of a process ``ensure_preloaded`` re-executed:
#: ``execve`` keeps the id, so a second call in that process does nothing (no loop when the
#: loader could not preload the library), while child processes that inherit it still check.
REEXEC_GUARD_ENV = "LOCALAI_MLX_BLAS_REEXEC"


def _mapped_paths() -> set[str] | None:
    """Resolved paths of the files mapped into this process, or None when unreadable."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return {line.split(None, 5)[-1].strip() for line in maps if "/" in line}
    except OSError:
        return None


def reexec_plan(env: Mapping[str, str], pid: int, mapped: set[str] | None) -> dict[str, str] | None:
    """The environment to re-execute this process with so the fast BLAS is preloaded, or None.

    None when nothing is to be done: not Linux, no fast BLAS installed (or
    ``LOCALAI_MLX_BLAS=none``), every library of the preload already mapped (``mapped``:
    the resolved paths in ``/proc/self/maps``; None = unknown, counts as not mapped), or
    ``env[REEXEC_GUARD_ENV] == str(pid)`` (this process was already re-executed once).
    Reads ``LOCALAI_MLX_BLAS`` from ``os.environ`` (as ``preload_env`` does).
    """
    if str(pid) == env.get(REEXEC_GUARD_ENV):
        return None
    libraries = _preload_libraries()
    if not libraries:
        return None
    if mapped is not None and all(str(p) in mapped for p in libraries):
        return None
    wanted = preload_env(env)
    wanted[REEXEC_GUARD_ENV] = str(pid)
    return wanted


def ensure_preloaded(argv: Iterable[str] | None = None) -> None:
    """Make sure MLX in this process runs on the fast BLAS, re-executing it if needed.

    Call it first thing in a program's ``__main__``, before anything imports MLX (or
    numpy/grpc: a re-exec throws their start-up time away). On Linux, when the fast BLAS
    (``blas_library_path()``) is installed but not mapped into this process (started as
    ``python backend.py`` rather than through ``run.sh``), replaces the process with the
    same interpreter and arguments under ``preload_env``'s environment (``os.execve``: same
    process id, so LocalAI's process tracking and signals are unaffected). ``argv``: the
    arguments after the interpreter (default: the original ones, ``sys.orig_argv[1:]``, so
    interpreter options such as ``-u`` survive). Returns normally when nothing is to be
    done, with ``LOCALAI_MLX_BLAS=none``, or on any problem (logged as a warning): it
    never stops the start; at worst MLX runs on its bundled reference BLAS.
    """
    try:
        env = reexec_plan(os.environ, os.getpid(), _mapped_paths())
        if env is None:
            return
        args = list(argv) if argv is not None else list(getattr(sys, "orig_argv", [""])[1:])
        if not args:
            args = list(sys.argv)
        executable = sys.executable
        if not executable or not os.access(executable, os.X_OK):
            raise OSError(f"cannot re-execute the interpreter {executable!r}")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.execve(executable, [executable, *args], env)
    except Exception as exc:  # never fail the start over a speed-up
        logger.warning(
            "could not restart with the fast BLAS preloaded (%s); MLX keeps its bundled "
            "BLAS. Start through run.sh or set LD_PRELOAD (see %s).",
            exc,
            BLAS_ENV,
        )


def _main(argv: Iterable[str]) -> int:
    """``python -m loading.cpu_fast_path --exports``: print the shell exports for run.sh."""
    args = list(argv)
    if args == ["--exports"]:
        sys.stdout.write(shell_exports())
        return 0
    if args == ["--check"]:
        report = check_blas()
        sys.stdout.write(f"{report.library} {report.gflops:.1f} GFLOP/s fast={report.fast}\n")
        return 0
    sys.stderr.write("usage: python -m loading.cpu_fast_path --exports | --check\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
