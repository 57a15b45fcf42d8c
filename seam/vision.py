"""mlx-vlm's processors: the one module global of theirs that we replace.

mlx-vlm's processors end with ``to_mlx`` (their module's global, from
``mlx_vlm.models.base``), which makes MLX arrays of the processed inputs. Our prompt worker
threads must not make MLX arrays (all MLX work is on the engine thread), and the processors
have no option to return numpy: so each processor's module gets a ``to_mlx`` that, on a
thread inside `numpy_outputs`, returns the numpy arrays as they are.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, cast

PRIVATE = (
    (
        "mlx_vlm.models.base",
        "",
        "to_mlx",
        "replaced in each processor's module so that processors return numpy on the "
        "prompt worker threads; no option for it",
    ),
)

_numpy_threads = threading.local()


def numpy_on_workers(processor: Any) -> None:
    """Install the numpy-aware ``to_mlx`` in the modules of ``processor``'s classes (once
    per module; at load)."""
    for cls in type(processor).__mro__:
        module = sys.modules.get(cls.__module__)
        original = getattr(module, "to_mlx", None)
        if original is None or getattr(original, "_numpy_aware", False):
            continue

        def to_mlx(data: dict, _original: Any = original) -> dict:
            if getattr(_numpy_threads, "active", False):
                return dict(data)
            return cast(dict, _original(data))

        to_mlx._numpy_aware = True  # type: ignore[attr-defined]
        setattr(module, "to_mlx", to_mlx)  # noqa: B010


class numpy_outputs:
    """Context: processor calls on this thread return numpy arrays (see `numpy_on_workers`)."""

    def __enter__(self) -> None:
        _numpy_threads.active = True

    def __exit__(self, *exc: object) -> None:
        _numpy_threads.active = False
