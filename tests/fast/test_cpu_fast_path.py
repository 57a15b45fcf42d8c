"""cpu_fast_path: mode selection, float32 dequantization, the BLAS preload's settings and
re-exec plan. In other processes (a backend, a fresh interpreter):
tests/process/test_cpu_fast_path.py.
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn
import pytest
from helpers import LINUX

from loading import cpu_fast_path as cfp

GB = 1 << 30


@pytest.mark.parametrize(
    ("option", "device", "quantized", "f32_bytes", "budget", "expected"),
    [
        ("auto", "cpu", True, 1 * GB, 2 * GB, "dense"),
        (None, "cpu", True, 2 * GB, 2 * GB, "dense"),
        ("auto", "cpu", True, 3 * GB, 2 * GB, "quantized"),
        (True, "cpu", True, 3 * GB, 2 * GB, "dense"),
        ("true", "cpu", True, 3 * GB, 2 * GB, "dense"),
        (" TRUE ", "cpu", True, 1 * GB, 2 * GB, "dense"),
        (False, "cpu", True, 1 * GB, 2 * GB, "quantized"),
        ("false", "cpu", True, 1 * GB, 2 * GB, "quantized"),
        ("auto", "gpu", True, 1 * GB, 2 * GB, "quantized"),
        ("true", "gpu", True, 1 * GB, 2 * GB, "quantized"),
        ("auto", "cpu", False, 1 * GB, 2 * GB, "dense"),
    ],
)
def test_choose_cpu_mode_table(option, device, quantized, f32_bytes, budget, expected):
    got = cfp.choose_cpu_mode(
        option,
        device_type=device,
        quantized=quantized,
        float32_bytes=f32_bytes,
        budget_bytes=budget,
    )
    assert got == expected


def test_auto_stays_quantized_without_fast_blas():
    kwargs = dict(device_type="cpu", quantized=True, float32_bytes=1, budget_bytes=GB)
    assert cfp.choose_cpu_mode("auto", fast_blas=False, **kwargs) == "quantized"
    assert cfp.choose_cpu_mode("true", fast_blas=False, **kwargs) == "dense"


@pytest.mark.parametrize("bad", ["maybe", "2", 1, 0.5])
def test_bad_option_names_cpu_dequantize(bad):
    for device in ("cpu", "gpu"):
        with pytest.raises(ValueError, match="cpu_dequantize"):
            cfp.choose_cpu_mode(
                bad, device_type=device, quantized=True, float32_bytes=1, budget_bytes=GB
            )


def test_default_dequantize_budget_is_half_of_ram():
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < cfp.default_dequantize_budget() <= ram // 2 + 1


def _tiny_quantized(dtype=mx.float16):
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    model.set_dtype(dtype)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def _all_float32(model) -> bool:
    from mlx.utils import tree_flatten

    return all(v.dtype == mx.float32 for _, v in tree_flatten(model.parameters()))


def test_dequantize_to_float32_matches_quantized_outputs():
    model = _tiny_quantized()
    x = mx.random.normal((4, 64))
    # Reference: the quantized model with its float16 scales evaluated in float32.
    model.set_dtype(mx.float32)
    expected = model(x)
    predicted = cfp.float32_size(model)
    cfp.dequantize_to_float32(model)
    assert not any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules())
    assert _all_float32(model)
    from mlx.utils import tree_flatten

    assert predicted == sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    assert predicted == (64 * 128 + 128 + 128 * 32 + 32) * 4
    assert mx.allclose(model(x), expected, atol=1e-4, rtol=1e-4).item()


def test_cast_happens_before_dequantize():
    # Dequantizing with float16 scales would round every weight to float16.
    model = _tiny_quantized()
    layer = model.layers[0]
    exact = mx.dequantize(
        layer.weight, layer.scales.astype(mx.float32), layer.biases.astype(mx.float32), 32, 4
    )
    cfp.dequantize_to_float32(model)
    assert mx.array_equal(model.layers[0].weight, exact).item()


def test_prepare_for_cpu_modes():
    cpu = mx.Device(mx.cpu)
    model = _tiny_quantized()
    assert cfp.prepare_for_cpu(model, "auto", budget_bytes=1, device=cpu) == "quantized"
    assert isinstance(model.layers[0], nn.QuantizedLinear)
    assert model.layers[0].scales.dtype == mx.float32
    assert cfp.prepare_for_cpu(model, "true", budget_bytes=1, device=cpu) == "dense"
    assert isinstance(model.layers[0], nn.Linear) and _all_float32(model)


def test_prepare_for_cpu_leaves_other_devices_alone():
    model = _tiny_quantized()
    assert cfp.prepare_for_cpu(model, "true", device=mx.Device(mx.gpu)) == "quantized"
    assert model.layers[0].scales.dtype == mx.float16
    with pytest.raises(ValueError, match="cpu_dequantize"):
        cfp.prepare_for_cpu(model, "bogus", device=mx.Device(mx.gpu))


@pytest.mark.skipif(not LINUX, reason="the BLAS preload is Linux-only")
def test_blas_library_is_installed():
    path = cfp.blas_library_path()
    assert path is not None, "run `pip install -r requirements-cpu.txt` (mkl)"
    assert path.is_file()


@pytest.mark.skipif(not LINUX, reason="the BLAS preload is Linux-only")
def test_preload_env_is_idempotent_and_respects_settings():
    base = {"LD_PRELOAD": "/x/other.so", "MKL_THREADING_LAYER": "SEQUENTIAL"}
    once = cfp.preload_env(base)
    assert once == cfp.preload_env(once)
    assert once["LD_PRELOAD"].split()[-1] == "/x/other.so"
    assert str(cfp.blas_library_path()) in once["LD_PRELOAD"].split()
    assert once["MKL_THREADING_LAYER"] == "SEQUENTIAL"
    os.environ[cfp.BLAS_ENV] = "none"
    try:
        assert cfp.preload_env(base) == base
    finally:
        del os.environ[cfp.BLAS_ENV]


def test_prepare_for_cpu_keeps_unquantized_model_over_budget():
    model = nn.Linear(64, 64)
    model.set_dtype(mx.float16)
    cpu = mx.Device(mx.cpu)
    assert cfp.prepare_for_cpu(model, "auto", budget_bytes=1, device=cpu) == "dense"
    assert model.weight.dtype == mx.float16
    assert cfp.prepare_for_cpu(model, "auto", budget_bytes=GB, device=cpu) == "dense"
    assert model.weight.dtype == mx.float32


def test_known_fast_libraries_count_as_fast_whatever_they_timed():
    assert cfp.known_fast_library("/x/.venv/lib/libmkl_rt.so.3")
    assert cfp.known_fast_library("/usr/lib/x86_64-linux-gnu/libopenblas.so.0")
    assert not cfp.known_fast_library("/x/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0")


# --------------------------------------------------------------------------- re-exec


@pytest.mark.skipif(not LINUX, reason="the BLAS preload is Linux-only")
def test_reexec_plan_decides_from_guard_setting_and_maps(monkeypatch):
    monkeypatch.delenv(cfp.BLAS_ENV, raising=False)
    libs = {str(p) for p in cfp._preload_libraries()}
    base = {"PATH": "/bin", "LD_PRELOAD": ""}
    plan = cfp.reexec_plan(base, 4242, mapped=set())
    assert plan is not None
    assert set(plan["LD_PRELOAD"].split()) == libs
    assert plan[cfp.REEXEC_GUARD_ENV] == "4242" and plan["PATH"] == "/bin"
    assert cfp.reexec_plan(base, 4242, mapped=None) is not None  # maps unreadable
    assert cfp.reexec_plan(base, 4242, mapped=libs | {"/x/libc.so.6"}) is None
    # Already re-executed once (execve keeps the pid): never loops.
    assert cfp.reexec_plan({**base, cfp.REEXEC_GUARD_ENV: "4242"}, 4242, set()) is None
    # A child that inherited the guard from its parent still gets the preload.
    assert cfp.reexec_plan({**base, cfp.REEXEC_GUARD_ENV: "1"}, 4242, set()) is not None
    monkeypatch.setenv(cfp.BLAS_ENV, "none")
    assert cfp.reexec_plan(base, 4242, mapped=set()) is None


@pytest.mark.skipif(not LINUX, reason="the BLAS preload is Linux-only")
def test_ensure_preloaded_never_fails_the_start(monkeypatch, caplog):
    def broken_execve(*args):
        raise OSError("exec format error")

    monkeypatch.delenv(cfp.REEXEC_GUARD_ENV, raising=False)
    monkeypatch.delenv(cfp.BLAS_ENV, raising=False)
    monkeypatch.setattr(cfp, "_mapped_paths", lambda: set())
    monkeypatch.setattr(cfp.os, "execve", broken_execve)
    with caplog.at_level("WARNING", logger=cfp.logger.name):
        cfp.ensure_preloaded(["-c", "pass"])
    assert "exec format error" in caplog.text and "run.sh" in caplog.text
