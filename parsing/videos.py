"""Videos of a request (`PredictOptions.Videos`): base64 decoding, bounds, and frames sampled
as mlx-vlm samples them.

LocalAI sends each video as the file's bytes, base64-encoded (a chat message's ``video_url``
part, core/http/middleware/request.go, through ``utils.GetContentURIAsBase64``). `read_videos`
runs in the parsing layer, before anything is queued: base64 (`images.base64_file`), the count
and bytes bounded (options ``max_videos``, ``max_video_bytes``), the format checked by its
magic bytes, the bytes hashed. `decode_frames` runs on the prompt worker threads
(`engine.vision_prompt`), off the event loop and the engine thread.

Decoders. Video files (MP4/QuickTime, WebM/Matroska, AVI) are read by mlx-vlm's own reader,
``mlx_vlm.utils.load_video``, which uses OpenCV (opencv-python-headless, in
requirements-vision.txt: mlx-vlm's own requirements name opencv-python, and mlx-vlm is
installed without them); `loading.vision.VisionParts.frames` calls it. Where cv2 is not
installed a video file is refused with INVALID_ARGUMENT saying so. Animated GIF, WebP and
PNG (APNG) are decoded by PIL, already here for images (`decode_frames`).

Sampling (`frame_indices`): mlx-vlm's rule in ``load_video`` (the rule sits inside its
OpenCV reader, so it cannot be called on PIL's frames; written here from it, and checked
against mlx-vlm's reader on the same clip in tests/model/test_vision.py): with the
source's frame count T and rate (T over the summed frame durations; 1 fps when the file
has none, as mlx-vlm's fallback for a rate OpenCV cannot read), take duration x ``fps``
frames, clamped to [``min_frames``, min(``max_frames``, T)] in multiples of
``frame_factor`` (rounded up for the lower bound, down for the upper and the count), at
``linspace(0, T - 1, n).round()``. ``fps``, ``min_frames``, ``max_frames`` and
``frame_factor`` are the processor's (mlx-vlm's ``resolve_video_sampling``: 2 fps, 4 to
768 frames, pairs), ``max_frames`` capped by the option ``max_video_frames``
(`loading.vision`).

Bounds: one frame's width x height at most ``max_image_pixels`` (read from the header, before
any pixel is decoded), at most ``MAX_SOURCE_FRAMES`` frames and ``MAX_SOURCE_PIXELS`` pixels
in the file (every frame is decoded on the way), and the sampled
frames of a request at most ``images.MAX_REQUEST_PIXELS`` pixels in all. Frames are decoded
while holding one of the process's image decode slots (`images.DECODE_SLOTS`).

Every refusal is a ``ValueError`` naming ``PredictOptions.Videos[i]`` (INVALID_ARGUMENT).
No MLX here; PIL and numpy are imported only when frames are decoded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from parsing import images as images_mod

MAX_SOURCE_FRAMES = 10_000  # frames a video file may have (each is read for its duration)
# Pixels of all the frames of a file: animations are decoded frame after frame (each
# frame draws over the one before) to reach a frame and to read its duration.
MAX_SOURCE_PIXELS = 1 << 28
FORMATS = ("GIF", "WEBP", "PNG")  # what PIL decodes as animations
# Video files, read by mlx-vlm's own reader (OpenCV) where cv2 is installed (`decoder`).
CONTAINERS = ("MP4", "MATROSKA", "AVI")
_CONTAINERS = "MP4, QuickTime, WebM, Matroska or AVI"


@dataclass(frozen=True, repr=False)
class VideoData(images_mod.MediaFile):
    """One video of ``PredictOptions.Videos``; ``format`` is one of ``FORMATS`` or
    ``CONTAINERS``."""


@dataclass(frozen=True)
class FrameSampling:
    """How frames are taken from a video (mlx-vlm's ``VideoSampling``, settled at load)."""

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = images_mod.MAX_VIDEO_FRAMES
    frame_factor: int = 2


def _field(index: int) -> str:
    return f"PredictOptions.Videos[{index}]"


def container_format(data: bytes) -> str | None:
    """``"MP4"`` (and QuickTime), ``"MATROSKA"`` (and WebM) or ``"AVI"`` from the file's
    magic bytes; None for anything else."""
    if data[4:8] == b"ftyp":
        return "MP4"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "MATROSKA"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "AVI"
    return None


def has_decoder() -> bool:
    """Whether video files can be read: OpenCV (cv2), mlx-vlm's video reader, is installed
    (looked up, not imported)."""
    return importlib.util.find_spec("cv2") is not None


def sniff_format(data: bytes) -> str | None:
    """``"GIF"``, ``"WEBP"`` or ``"PNG"`` from the file's magic bytes; None otherwise."""
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    fmt = images_mod.sniff_format(data)
    return fmt if fmt in FORMATS else None


def read_video(index: int, text: str, max_bytes: int = images_mod.MAX_VIDEO_BYTES) -> VideoData:
    """Decode one ``PredictOptions.Videos`` entry (base64, as `images.base64_file`).
    ValueError naming the entry: empty, a URL, not base64, over ``max_bytes`` bytes, a video
    container this backend cannot decode, or no animated GIF/WebP/PNG."""
    field = _field(index)
    data = images_mod.base64_file(field, text, max_bytes, "video")
    fmt = container_format(data)
    if fmt is not None:
        if not has_decoder():
            raise ValueError(
                f"{field} is a video file ({_CONTAINERS}) and this installation has no decoder "
                "for those (mlx-vlm reads them with OpenCV: install opencv-python-headless, "
                "requirements-vision.txt), or send the video as an animated WebP, GIF or PNG "
                "(e.g. ffmpeg -i in.mp4 -vf fps=2 out.webp)"
            )
        return VideoData(index, data, fmt, hashlib.sha256(data).hexdigest())
    fmt = sniff_format(data)
    if fmt is None:
        raise ValueError(
            f"{field} is not an animated GIF, WebP or PNG (its first bytes are "
            f"{data[:8].hex()}); send one of those formats"
        )
    return VideoData(index, data, fmt, hashlib.sha256(data).hexdigest())


def read_videos(
    entries: Sequence[str],
    max_videos: int = images_mod.MAX_VIDEOS,
    max_bytes: int = images_mod.MAX_VIDEO_BYTES,
) -> tuple[VideoData, ...]:
    """Every ``PredictOptions.Videos`` entry, in order (`read_video`); ValueError when there
    are more than ``max_videos``."""
    if len(entries) > max_videos:
        raise ValueError(
            f"PredictOptions.Videos has {len(entries)} videos, more than the {max_videos} a "
            "request may carry (load option max_videos)"
        )
    return tuple(read_video(i, e, max_bytes) for i, e in enumerate(entries))


def frame_indices(total: int, seconds: float, sampling: FrameSampling) -> list[int]:
    """The frames mlx-vlm's ``load_video`` takes from a video of ``total`` frames lasting
    ``seconds`` (module doc). ValueError (naming no field) when no valid count exists."""
    factor = max(1, sampling.frame_factor)
    source_fps = total / seconds if seconds > 0 else 1.0
    lo = math.ceil(sampling.min_frames / factor) * factor
    hi = math.floor(min(sampling.max_frames, total) / factor) * factor
    n = total / source_fps * sampling.fps
    n = min(max(n, lo), hi, total)
    n = math.floor(n / factor) * factor
    if not factor <= n <= total:
        raise ValueError(f"it has {total} frames; at least {factor} are needed")
    return _linspace(total, n)


def _linspace(total: int, n: int) -> list[int]:
    import numpy as np

    return [int(i) for i in np.linspace(0, total - 1, n).round().astype(int)]


def _durations(img: Any, total: int) -> float:
    """Seconds the animation lasts: the sum of its frames' durations (milliseconds; PIL
    knows a WebP frame's only once it is loaded)."""
    ms = 0.0
    for i in range(total):
        img.seek(i)
        if img.format == "WEBP":
            img.load()
        duration = img.info.get("duration", 0)
        ms += float(duration) if isinstance(duration, (int, float)) else 0.0
    return ms / 1000.0


def decode_frames(
    video: VideoData,
    sampling: FrameSampling,
    max_pixels: int = images_mod.MAX_IMAGE_PIXELS,
    budget: int = images_mod.MAX_REQUEST_PIXELS,
) -> Any:
    """The sampled frames of ``video`` as one uint8 array (T, H, W, 3), RGB, in order.
    ValueError naming the entry: undecodable, one frame only (an image: send it in
    ``Images``), more than ``MAX_SOURCE_FRAMES`` frames, a frame over ``max_pixels``, too
    few frames for the sampling, or sampled frames holding more than ``budget`` pixels
    (checked before they are decoded: the caller passes what the request has left)."""
    import numpy as np
    from PIL import Image

    field = _field(video.index)
    try:
        with Image.open(io.BytesIO(video.data), formats=list(FORMATS)) as img:
            width, height = img.size
            if width <= 0 or height <= 0:
                raise ValueError(f"{field} has no pixels ({width}x{height})")
            if width * height > max_pixels:
                raise ValueError(
                    f"{field} is {width}x{height} = {width * height} pixels a frame, more than "
                    f"the {max_pixels} allowed (load option max_image_pixels)"
                )
            total = int(getattr(img, "n_frames", 1))
            if total < 2:
                raise ValueError(f"{field} has one frame: send a still image in Images")
            if total > MAX_SOURCE_FRAMES or total * width * height > MAX_SOURCE_PIXELS:
                raise ValueError(
                    f"{field} has {total} frames of {width}x{height}, more than a video may "
                    f"have ({MAX_SOURCE_FRAMES} frames, {MAX_SOURCE_PIXELS} pixels in all: "
                    "every frame is decoded to read its duration)"
                )
            with images_mod.DECODE_SLOTS:
                try:
                    wanted = frame_indices(total, _durations(img, total), sampling)
                except ValueError as exc:
                    raise ValueError(f"{field}: {exc}") from None
                if len(wanted) * width * height > budget:
                    raise ValueError(
                        f"{field}: its {len(wanted)} sampled frames of {width}x{height} hold "
                        f"{len(wanted) * width * height} pixels, more than the {budget} the "
                        "request has left; send shorter or smaller videos, or lower the load "
                        "option max_video_frames"
                    )
                frames = []
                for i in wanted:
                    img.seek(i)
                    frames.append(np.asarray(img.convert("RGB")))
    except ValueError:
        raise
    except Exception as exc:  # PIL raises OSError, SyntaxError, EOFError...
        raise ValueError(
            f"{field} cannot be decoded as an animated {video.format}: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    return np.stack(frames)
