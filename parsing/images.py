"""Images of a request (`PredictOptions.Images`): base64 decoding, bounds, decoding to pixels.

LocalAI sends each image as the file's bytes, base64-encoded (other clients may prefix a
data URL, ``data:image/png;base64,``). `read_images` runs in the parsing layer, before
anything is queued: it decodes the base64, bounds the count and the bytes, checks the
format by its magic bytes (PNG, JPEG, WebP) and hashes the bytes (the image's identity in
the vision-feature and prompt caches). A URL is refused, never fetched: the backend opens
no connection on a client's behalf. `decode` turns one image into RGB pixels (PIL),
refusing more than ``max_pixels`` before any pixel is decoded (a small file can expand to
gigabytes); it runs on the prompt worker threads (`engine.vision_prompt`), off the event
loop and off the engine thread.

Memory: the model's processor resizes every image to its own size anyway
(`DecodeTarget`), so `decode` keeps no more pixels than that: a JPEG is decoded at 1/2,
1/4 or 1/8 scale by libjpeg (PIL's ``draft``), and any image is then reduced by the largest
integer factor (PIL's ``reduce``, a box average) that keeps it at least the processor's
size; the full-size buffer is freed before the next image. `held_size` predicts, from the
header alone, the size `decode` returns, so `check_request` bounds a request's images
(``MAX_REQUEST_PIXELS`` in all) before any is decoded. At most ``DECODES_AT_ONCE`` images
are decoded at a time in the process, which bounds the full-size buffers across requests.

Every refusal is a ``ValueError`` naming ``PredictOptions.Images[i]`` (INVALID_ARGUMENT).
No MLX here, and PIL is imported only when an image is decoded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_IMAGES = 16  # images per request (load option max_images)
MAX_IMAGE_BYTES = 20 << 20  # bytes of one image file, after base64 decoding
MAX_IMAGE_PIXELS = 40_000_000  # width x height decoded (load option max_image_pixels)
# Pixels a request's images may hold once decoded (after the reduction to the processor's
# size): 64 M pixels = 192 MB of RGB, more than 16 images at any common processor size.
MAX_REQUEST_PIXELS = 64_000_000
# Full-size decodes at once in the process: the transient buffers (up to max_image_pixels
# x 4 bytes each) of concurrent image requests stay bounded at two images.
DECODES_AT_ONCE = 2
_DECODING = threading.BoundedSemaphore(DECODES_AT_ONCE)
DECODE_SLOTS = _DECODING  # shared with parsing.videos: frames count against the same bound
# EXIF orientation -> the transpose that undoes it (as PIL's ImageOps.exif_transpose).
_ORIENT = {2: 0, 3: 3, 4: 1, 5: 5, 6: 4, 7: 6, 8: 2}  # values of PIL.Image.Transpose
FORMATS = ("PNG", "JPEG", "WEBP")
VISION_CACHE_ENTRIES = 32  # images whose vision-tower output is kept (vision_cache_entries)
VISION_CACHE_BYTES = 512 << 20  # bytes those may hold (option vision_cache_bytes)
MAX_VIDEOS = 2  # videos per request (load option max_videos)
MAX_VIDEO_BYTES = 32 << 20  # bytes of one video file (option max_video_bytes; gRPC caps 50 MB)
MAX_VIDEO_FRAMES = 32  # frames sampled from one video (option max_video_frames)

_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)?(;[\w=.+-]+)*;base64,", re.IGNORECASE)
_URL = re.compile(r"^(https?|ftp|file|s3|gs|hf|huggingface)://", re.IGNORECASE)
_BASE64 = re.compile(rb"^[A-Za-z0-9+/_-]*={0,2}$")


@dataclass(frozen=True)
class MediaFile:
    """One media file of a request: ``index`` in its field, the file's ``data``, its
    ``format`` and ``digest`` (SHA-256 hex of ``data``)."""

    index: int
    data: bytes
    format: str
    digest: str

    def __repr__(self) -> str:  # never log media bytes
        name = type(self).__name__
        return f"{name}({self.index}, {self.format}, {len(self.data)} bytes, {self.digest[:12]})"


@dataclass(frozen=True, repr=False)
class ImageData(MediaFile):
    """One image of ``PredictOptions.Images``; ``format`` is one of ``FORMATS``."""


def _field(index: int) -> str:
    return f"PredictOptions.Images[{index}]"


def sniff_format(data: bytes) -> str | None:
    """``"PNG"``, ``"JPEG"`` or ``"WEBP"`` from the file's magic bytes; None otherwise."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def base64_file(field: str, text: str, max_bytes: int, what: str = "image") -> bytes:
    """The file bytes of one base64 entry (with or without a data-URL prefix; whitespace
    ignored; standard or URL-safe alphabet) of request field ``field``. ValueError naming
    it: empty, a URL, not base64, or over ``max_bytes`` bytes (``what``: the noun)."""
    text = text.strip()
    if not text:
        raise ValueError(f"{field} is empty: send the {what} file's bytes, base64-encoded")
    if _URL.match(text):
        raise ValueError(
            f"{field} is a URL; this backend does not fetch URLs: send the {what} file's "
            "bytes, base64-encoded"
        )
    match = _DATA_URL.match(text)
    if match:
        text = text[match.end() :]
    elif text.lower().startswith("data:"):
        raise ValueError(f"{field} is a data URL without ';base64,': only base64 data is read")
    # base64 grows 4/3: refuse before decoding what cannot fit.
    if len(text) > (max_bytes + 2) // 3 * 4 + len(text) // 76 * 2 + 4:
        raise ValueError(f"{field} is larger than {max_bytes} bytes, the limit per {what}")
    raw = re.sub(r"\s+", "", text).encode("ascii", "replace")
    if not _BASE64.match(raw):
        raise ValueError(f"{field} is not valid base64")
    raw = raw.replace(b"-", b"+").replace(b"_", b"/")
    raw += b"=" * (-len(raw) % 4)
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{field} is not valid base64") from None
    if not data:
        raise ValueError(f"{field} is empty: send the {what} file's bytes, base64-encoded")
    if len(data) > max_bytes:
        raise ValueError(
            f"{field} is {len(data)} bytes, more than the {max_bytes}-byte limit per {what}"
        )
    return data


def read_image(index: int, text: str, max_bytes: int = MAX_IMAGE_BYTES) -> ImageData:
    """Decode one ``PredictOptions.Images`` entry (`base64_file`). ValueError naming the
    entry: empty, a URL, not base64, over ``max_bytes`` bytes, or not PNG/JPEG/WebP."""
    field = _field(index)
    data = base64_file(field, text, max_bytes)
    fmt = sniff_format(data)
    if fmt is None:
        raise ValueError(
            f"{field} is not a PNG, JPEG or WebP image (its first bytes are "
            f"{data[:8].hex()}); send one of those formats"
        )
    return ImageData(index, data, fmt, hashlib.sha256(data).hexdigest())


def read_images(
    entries: Sequence[str], max_images: int = MAX_IMAGES, max_bytes: int = MAX_IMAGE_BYTES
) -> tuple[ImageData, ...]:
    """Every ``PredictOptions.Images`` entry, in order (see `read_image`); ValueError when
    there are more than ``max_images``."""
    if len(entries) > max_images:
        raise ValueError(
            f"PredictOptions.Images has {len(entries)} images, more than the {max_images} a "
            "request may carry (load option max_images)"
        )
    return tuple(read_image(i, e, max_bytes) for i, e in enumerate(entries))


@dataclass(frozen=True)
class DecodeTarget:
    """The size the model's processor resizes every image to (0 = not known): a fixed
    ``height`` x ``width`` (Gemma 3, SigLIP), a ``shortest_edge`` or ``longest_edge``, or at
    most ``max_pixels`` (Qwen-style dynamic resolution). Built by `loading.vision` from the
    processor's config; the default knows nothing and reduces nothing."""

    height: int = 0
    width: int = 0
    shortest_edge: int = 0
    longest_edge: int = 0
    max_pixels: int = 0

    def factor(self, width: int, height: int) -> int:
        """The largest integer factor (>= 1) an image of ``width`` x ``height`` can be
        reduced by and still be at least the target in every bound that is known."""
        bounds = []
        if self.height and self.width:
            bounds.append(min(width // self.width, height // self.height))
        if self.shortest_edge:
            bounds.append(min(width, height) // self.shortest_edge)
        if self.longest_edge:
            bounds.append(max(width, height) // self.longest_edge)
        if self.max_pixels:
            bounds.append(math.isqrt(width * height // self.max_pixels))
        return max(1, min(bounds)) if bounds else 1


def _draft_scale(width: int, height: int, factor: int) -> int:
    """libjpeg's scale (1, 2, 4 or 8) for PIL's ``draft`` asked for ``1/factor`` of the
    size (PIL's JpegImagePlugin.draft: the largest scale not above the request)."""
    if factor < 2:
        return 1
    want = min(width // max(1, width // factor), height // max(1, height // factor))
    return next(s for s in (8, 4, 2, 1) if want >= s)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def held_size(
    width: int, height: int, fmt: str, target: DecodeTarget, rotated: bool = False
) -> tuple[int, int]:
    """The (width, height) `decode` returns for an image of ``width`` x ``height`` pixels
    in format ``fmt`` (``rotated``: its EXIF orientation swaps the sides)."""
    w, h = (height, width) if rotated else (width, height)
    factor = target.factor(w, h)
    if fmt == "JPEG":
        scale = _draft_scale(width, height, factor)
        width, height = _ceil_div(width, scale), _ceil_div(height, scale)
        w, h = (height, width) if rotated else (width, height)
        factor = target.factor(w, h)
    return _ceil_div(w, factor), _ceil_div(h, factor)


def _header(img: Any, field: str, max_pixels: int) -> tuple[int, int, int]:
    """(width, height, EXIF orientation) from an opened image's header; ValueError when
    it has no pixels, more than ``max_pixels`` or several frames."""
    width, height = img.size
    if width <= 0 or height <= 0:
        raise ValueError(f"{field} has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise ValueError(
            f"{field} is {width}x{height} = {width * height} pixels, more than the "
            f"{max_pixels} allowed (load option max_image_pixels); send a smaller image"
        )
    if getattr(img, "n_frames", 1) > 1:
        raise ValueError(f"{field} is animated ({img.n_frames} frames): send one frame")
    try:
        orientation = int(img.getexif().get(0x0112, 1) or 1)
    except Exception:  # an unreadable EXIF block: as PIL's exif_transpose, no rotation
        orientation = 1
    return width, height, orientation


def _open(image: ImageData) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(image.data), formats=list(FORMATS))


def _undecodable(image: ImageData, exc: Exception) -> ValueError:
    return ValueError(
        f"{_field(image.index)} cannot be decoded as a {image.format} image: "
        f"{type(exc).__name__}: {str(exc)[:200]}"
    )


def check_request(
    images: Sequence[ImageData],
    max_pixels: int = MAX_IMAGE_PIXELS,
    target: DecodeTarget = DecodeTarget(),
    max_request_pixels: int | None = None,
) -> int:
    """The pixels ``images`` will hold once decoded (`held_size`), read from their
    headers only. ValueError naming the field: an image over ``max_pixels``, animated,
    undecodable, or all of them holding more than ``max(max_request_pixels,
    max_pixels)`` (default ``MAX_REQUEST_PIXELS``)."""
    total = 0
    for image in images:
        try:
            with _open(image) as img:
                width, height, orientation = _header(img, _field(image.index), max_pixels)
        except ValueError:
            raise
        except Exception as exc:  # PIL raises OSError, SyntaxError, DecompressionBombError...
            raise _undecodable(image, exc) from None
        w, h = held_size(width, height, image.format, target, orientation in (5, 6, 7, 8))
        total += w * h
    bound = max(
        MAX_REQUEST_PIXELS if max_request_pixels is None else max_request_pixels, max_pixels
    )
    if total > bound:
        raise ValueError(
            f"PredictOptions.Images: the {len(images)} images hold {total} pixels once decoded "
            f"(each reduced to about the model's image size), more than the {bound} a "
            "request may hold; send fewer or smaller images, or several requests"
        )
    return total


def decode(
    image: ImageData, max_pixels: int = MAX_IMAGE_PIXELS, target: DecodeTarget = DecodeTarget()
) -> Any:
    """The image as an RGB ``PIL.Image`` of `held_size` (EXIF orientation applied, as
    mlx-vlm's ``load_image``), no larger than ``target`` needs (module doc). ValueError
    naming the entry when PIL cannot decode it, when it is larger than ``max_pixels``
    (width x height; checked from the header, before the pixels are decoded) or when it
    is animated with more than one frame."""
    from PIL import Image

    field = _field(image.index)
    try:
        with _open(image) as img:
            width, height, orientation = _header(img, field, max_pixels)
            rotated = orientation in (5, 6, 7, 8)
            w, h = (height, width) if rotated else (width, height)
            factor = target.factor(w, h)
            if img.format == "JPEG" and factor > 1:
                img.draft("RGB", (max(1, width // factor), max(1, height // factor)))
            with _DECODING:
                img.load()
                w, h = (img.height, img.width) if rotated else img.size
                factor = target.factor(w, h)
                out = img
                if factor > 1:
                    # reduce averages RGBA premultiplied; mlx-vlm drops alpha first.
                    rgb = out if out.mode in ("RGB", "L") else out.convert("RGB")
                    out = rgb.reduce(factor)
                    del rgb
                method = _ORIENT.get(orientation)
                if method is not None:
                    out = out.transpose(Image.Transpose(method))
                return out.convert("RGB")  # a copy: the decoded buffer is freed on close
    except ValueError:
        raise
    except Exception as exc:  # PIL raises OSError, SyntaxError, DecompressionBombError...
        raise _undecodable(image, exc) from None


@dataclass(frozen=True)
class ImageLimits:
    """Bounds on a request's images, from the load options ``max_images`` (images per
    request), ``max_image_bytes`` (bytes per image file) and ``max_image_pixels``
    (width x height per image, decoded)."""

    max_images: int = MAX_IMAGES
    max_bytes: int = MAX_IMAGE_BYTES
    max_pixels: int = MAX_IMAGE_PIXELS


@dataclass(frozen=True)
class VisionOptions:
    """The load options of vision-language models, read once at load (`params.load_params`):
    ``on`` (option ``vision``; false serves the model text-only), ``limits`` (the bounds of
    a request's images), ``max_pixels`` (option ``vision_max_pixels``: the processor's
    resize bound; None = the processor's own), ``cache_entries`` / ``cache_bytes``
    (options ``vision_cache_entries`` / ``vision_cache_bytes``: the vision-feature cache),
    ``max_videos`` / ``max_video_bytes`` / ``max_video_frames`` (the bounds of a request's
    videos, `parsing.videos`)."""

    on: bool = True
    limits: ImageLimits = ImageLimits()
    max_pixels: int | None = None
    cache_entries: int = VISION_CACHE_ENTRIES
    cache_bytes: int = VISION_CACHE_BYTES
    # PredictOptions.Videos (parsing/videos.py): options max_videos, max_video_bytes and
    # max_video_frames (frames sampled from one video).
    max_videos: int = MAX_VIDEOS
    max_video_bytes: int = MAX_VIDEO_BYTES
    max_video_frames: int = MAX_VIDEO_FRAMES
