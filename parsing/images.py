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

Every refusal is a ``ValueError`` naming ``PredictOptions.Images[i]`` (INVALID_ARGUMENT).
No MLX here, and PIL is imported only when an image is decoded.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_IMAGES = 16  # images per request (load option max_images)
MAX_IMAGE_BYTES = 20 << 20  # bytes of one image file, after base64 decoding
MAX_IMAGE_PIXELS = 40_000_000  # width x height decoded (load option max_image_pixels)
FORMATS = ("PNG", "JPEG", "WEBP")
VISION_CACHE_ENTRIES = 32  # images whose vision-tower output is kept (vision_cache_entries)
VISION_CACHE_BYTES = 512 << 20  # bytes those may hold (option vision_cache_bytes)

_DATA_URL = re.compile(r"^data:([\w.+-]+/[\w.+-]+)?(;[\w=.+-]+)*;base64,", re.IGNORECASE)
_URL = re.compile(r"^(https?|ftp|file|s3|gs|hf|huggingface)://", re.IGNORECASE)
_BASE64 = re.compile(rb"^[A-Za-z0-9+/_-]*={0,2}$")


@dataclass(frozen=True)
class ImageData:
    """One image of a request: ``index`` in ``PredictOptions.Images``, the file's ``data``,
    its ``format`` (one of ``FORMATS``) and ``digest`` (SHA-256 hex of ``data``)."""

    index: int
    data: bytes
    format: str
    digest: str

    def __repr__(self) -> str:  # never log image bytes
        return f"ImageData({self.index}, {self.format}, {len(self.data)} bytes, {self.digest[:12]})"


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


def read_image(index: int, text: str, max_bytes: int = MAX_IMAGE_BYTES) -> ImageData:
    """Decode one ``PredictOptions.Images`` entry (base64, with or without a data-URL
    prefix; whitespace ignored; standard or URL-safe alphabet). ValueError naming the
    entry: empty, a URL, not base64, over ``max_bytes`` bytes, or not PNG/JPEG/WebP."""
    field = _field(index)
    text = text.strip()
    if not text:
        raise ValueError(f"{field} is empty: send the image file's bytes, base64-encoded")
    if _URL.match(text):
        raise ValueError(
            f"{field} is a URL; this backend does not fetch URLs: send the image file's "
            "bytes, base64-encoded"
        )
    match = _DATA_URL.match(text)
    if match:
        text = text[match.end() :]
    elif text.lower().startswith("data:"):
        raise ValueError(f"{field} is a data URL without ';base64,': only base64 data is read")
    # base64 grows 4/3: refuse before decoding what cannot fit.
    if len(text) > (max_bytes + 2) // 3 * 4 + len(text) // 76 * 2 + 4:
        raise ValueError(f"{field} is larger than {max_bytes} bytes, the limit per image")
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
        raise ValueError(f"{field} is empty: send the image file's bytes, base64-encoded")
    if len(data) > max_bytes:
        raise ValueError(
            f"{field} is {len(data)} bytes, more than the {max_bytes}-byte limit per image"
        )
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


def decode(image: ImageData, max_pixels: int = MAX_IMAGE_PIXELS) -> Any:
    """The image as an RGB ``PIL.Image`` (EXIF orientation applied, as mlx-vlm's
    ``load_image``). ValueError naming the entry when PIL cannot decode it, when it is
    larger than ``max_pixels`` (width x height; checked from the header, before the
    pixels are decoded) or when it is animated with more than one frame."""
    from PIL import Image, ImageOps

    field = _field(image.index)
    try:
        with Image.open(io.BytesIO(image.data), formats=list(FORMATS)) as img:
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
            img.load()
            out = ImageOps.exif_transpose(img)
            return out.convert("RGB")
    except ValueError:
        raise
    except Exception as exc:  # PIL raises OSError, SyntaxError, DecompressionBombError...
        raise ValueError(
            f"{field} cannot be decoded as a {image.format} image: {type(exc).__name__}: "
            f"{str(exc)[:200]}"
        ) from None


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
    (options ``vision_cache_entries`` / ``vision_cache_bytes``: the vision-feature cache)."""

    on: bool = True
    limits: ImageLimits = ImageLimits()
    max_pixels: int | None = None
    cache_entries: int = VISION_CACHE_ENTRIES
    cache_bytes: int = VISION_CACHE_BYTES
