"""Vision-language models through mlx-vlm (0.7.10): telling them apart, loading them, and
the view of their language model that the engine's batch decodes.

Owns:

- ``vision_config(directory)``: whether a model directory is a vision-language model
  (its ``config.json`` has a ``vision_config``, or names a type that mlx-vlm knows and
  mlx-lm does not, and its weights hold a vision part).
- ``load``: model and processor with mlx-vlm's own classes (``mlx_vlm.utils.load``), the
  text tokenizer with mlx-lm's (streaming detokenizer, chat template, tool and reasoning
  markers, as for text models), returned as an ``LMView`` carrying a ``VisionParts``.
- ``LMView``: an mlx-lm-style model over ``model.language_model``: ``view(ids, cache=...,
  input_embeddings=..., position_ids=...)`` returns logits, ``view.layers`` and mlx-lm
  cache classes, so mlx-lm's ``BatchGenerator``, the prompt cache and Score treat it as
  any text model. Its parameters are the whole model's (vision tower included), so the
  CPU weight preparation and the weight count cover it all. For Qwen2-VL's mRoPE it
  always passes explicit positions: the cache offset (the language model's own
  ``_rope_deltas`` state is never used), so a row decodes at its own offset in a shared
  batch; an image prompt is prefilled at ``position_ids - rope_deltas`` for that
  (`engine.vision`), which keeps every relative position, and so the output, of
  mlx-vlm's generation.
- ``VisionParts``: what the engine and the prompt workers need of the vision part: the
  mlx-vlm model, its processor (called from the prompt worker threads with numpy output:
  no MLX there), the family's image tokens and per-image vision tower, the processor's
  signature (part of every image's cache identity), limits, and the vision-feature cache
  (engine thread only).

Not supported with the vision part (the model then loads text-only through mlx-lm, as
before this module, saying why): LoRA adapters, a draft model, n-gram speculation, a
quantized KV cache, distributed mode, the load option ``vision:false``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn

from errors import ModelLoadError
from parsing import images as images_mod
from parsing import videos as videos_mod
from parsing.images import DecodeTarget, ImageLimits, VisionOptions
from parsing.videos import FrameSampling, VideoData
from seam import vision as seam_vision

logger = logging.getLogger("localai.mlx." + __name__)

# What LocalAI writes where an image goes (templates.DefaultMultiMediaMarker), and what
# ModelMetadata reports as this backend's marker, so LocalAI leaves it as it is.
MEDIA_MARKER = "<__media__>"


@dataclass(frozen=True)
class Family:
    """How one model family marks images. ``placeholder``: the text one image is in a
    prompt before the processor expands it (what mlx-vlm's chat template writes);
    ``literals``: image tokens a request with images may not contain as text (only media
    markers place images); ``tower``: how one image runs through the vision tower alone
    ("qwen", "gemma3"; "" = the whole prompt's images at once, no feature cache);
    ``rope_delta``: the mRoPE position shift of an image can be computed from its grid
    (Qwen2-VL, Qwen2.5-VL), so cache keys can carry it."""

    placeholder: str
    literals: tuple[str, ...]
    tower: str = ""
    rope_delta: bool = False
    # The text one video is before the processor expands it (what the family's chat
    # template writes for a {"type": "video"} part); "" = this backend runs no video
    # through the family (`VisionParts.video_refusal`).
    video_placeholder: str = ""


_QWEN = Family(
    "<|vision_start|><|image_pad|><|vision_end|>",
    ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"),
    tower="qwen",
    rope_delta=True,
    video_placeholder="<|vision_start|><|video_pad|><|vision_end|>",
)
FAMILIES: dict[str, Family] = {
    "qwen2_vl": _QWEN,
    "qwen2_5_vl": _QWEN,
    "gemma3": Family(
        "<start_of_image>",
        ("<start_of_image>", "<image_soft_token>", "<end_of_image>"),
        tower="gemma3",
    ),
}


def _read_config(directory: Path) -> dict | None:
    try:
        config = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _mlx_lm_knows(model_type: str) -> bool:
    from mlx_lm.utils import MODEL_REMAPPING

    name = MODEL_REMAPPING.get(model_type, model_type)
    return importlib.util.find_spec(f"mlx_lm.models.{name}") is not None


def _mlx_vlm_knows(model_type: str) -> bool:
    spec = importlib.util.find_spec("mlx_vlm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return False
    root = Path(next(iter(spec.submodule_search_locations)))
    return (root / "models" / model_type / "__init__.py").is_file()


_VISION_WEIGHTS = ("vision", "visual", "multi_modal_projector", "mm_projector")


def _weight_names(directory: Path) -> list[str]:
    """Tensor names of the checkpoint: its index's weight map, else the safetensors
    headers (read without the tensor data)."""
    index = directory / "model.safetensors.index.json"
    try:
        return list(json.loads(index.read_text()).get("weight_map", {}))
    except (OSError, ValueError, AttributeError):
        pass
    names: list[str] = []
    for path in sorted(directory.glob("*.safetensors")):
        try:
            with path.open("rb") as f:
                size = int.from_bytes(f.read(8), "little")
                if 0 < size <= 64 << 20:
                    names += [k for k in json.loads(f.read(size)) if k != "__metadata__"]
        except (OSError, ValueError):
            continue
    return names


def vision_config(directory: Path) -> dict | None:
    """The ``config.json`` of ``directory`` when it is a vision-language model mlx-vlm
    can load: a non-empty ``vision_config``, or a ``model_type`` mlx-vlm has and mlx-lm
    has not (mlx-vlm and mlx-lm are looked up without importing mlx-vlm), and weights of
    a vision part (a checkpoint converted text-only keeps the config but not the tower:
    mlx-lm loads it, as before); else None."""
    directory = Path(directory)
    config = _read_config(directory)
    if config is None:
        return None
    model_type = str(config.get("model_type") or "").lower()
    if not model_type or importlib.util.find_spec("mlx_vlm") is None:
        return None
    if isinstance(config.get("vision_config"), dict) and config["vision_config"]:
        known = _mlx_vlm_knows(model_type)
    else:
        known = _mlx_vlm_knows(model_type) and not _mlx_lm_knows(model_type)
    if not known:
        return None
    names = _weight_names(directory)
    if names and not any(part in name for name in names for part in _VISION_WEIGHTS):
        return None
    return config


# --------------------------------------------------------------------------- processor
class _QuietTemplateKwargs(logging.Filter):
    """transformers warns on every image request that mlx-vlm's template arguments (e.g.
    its enable_thinking default) are not the processor's: noise, not a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "have to be in `processor_kwargs`" not in record.getMessage()


_QUIET = _QuietTemplateKwargs()


def _file_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# --------------------------------------------------------------------------- the parts
def decode_target(processor: Any, max_pixels: int | None = None) -> DecodeTarget:
    """The size ``processor``'s image processor resizes images to (its ``size``: height
    and width, shortest or longest edge; its ``max_pixels``, or ``max_pixels`` = the option
    ``vision_max_pixels`` when set), for `parsing.images.decode`; nothing known when the
    processor does not resize (``do_resize`` false) or names no size."""
    ip = getattr(processor, "image_processor", None)
    if ip is None or getattr(ip, "do_resize", True) is False:
        return DecodeTarget()

    def get(obj: Any, key: str) -> int:
        value = obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
        return int(value) if isinstance(value, (int, float)) and value > 0 else 0

    size = getattr(ip, "size", None)
    if isinstance(size, (int, float)):  # older processors: one int = the shortest edge
        size = {"shortest_edge": size}
    return DecodeTarget(
        height=get(size, "height"),
        width=get(size, "width"),
        shortest_edge=get(size, "shortest_edge"),
        longest_edge=get(size, "longest_edge"),
        max_pixels=max_pixels or get(ip, "max_pixels") or get(size, "max_pixels"),
    )


class VisionParts:
    """The vision part of a loaded vision-language model (see the module doc).

    Read-only after load, apart from the feature cache (engine thread only). ``model``:
    the mlx-vlm model; ``processor``: its processor; ``model_type``; ``family``;
    ``image_token_id``; ``signature``: a hash of what turns an image file into vision
    features and tokens (processor configs, resize options, mlx-vlm version);
    ``limits``: the request bounds (`parsing.images.ImageLimits`); ``size_kwargs``: the
    processor's per-call resize options (option ``vision_max_pixels``); ``decode_target``:
    the size the processor resizes to (`decode_target`), what images are decoded at.
    """

    def __init__(
        self, model: nn.Module, processor: Any, directory: Path, options: VisionOptions
    ) -> None:
        import mlx_vlm

        self.model = model
        self.processor = processor
        config = model.config
        self.model_type = str(config.model_type)
        self.limits: ImageLimits = options.limits
        tokenizer = getattr(processor, "tokenizer", processor)
        image_token = getattr(processor, "image_token", None) or getattr(
            tokenizer, "image_token", None
        )
        self.family = FAMILIES.get(self.model_type) or Family(
            image_token or "<image>", (image_token or "<image>",)
        )
        token_id = getattr(config, "image_token_id", None)
        if token_id is None:
            token_id = getattr(config, "image_token_index", None)
        if token_id is None and image_token:
            token_id = tokenizer.convert_tokens_to_ids(image_token)
        if not isinstance(token_id, int):
            raise ModelLoadError(
                f"vision model {directory}: its config names no image token "
                "(image_token_id / image_token_index); load it with the option vision:false "
                "to serve it text-only"
            )
        self.image_token_id = token_id
        self.video_token_id = getattr(config, "video_token_id", None)
        self.video_refusal = self._video_refusal(processor)
        self.video_sampling = self._video_sampling(processor, options.max_video_frames)
        self.mrope = hasattr(model.language_model, "get_rope_index")
        self.size_kwargs: dict[str, int] = {}
        if options.max_pixels is not None:
            self.size_kwargs["max_pixels"] = options.max_pixels
        self.decode_target = decode_target(processor, options.max_pixels)
        blob = json.dumps(
            [
                mlx_vlm.__version__ if hasattr(mlx_vlm, "__version__") else "",
                self.model_type,
                _file_text(directory / "preprocessor_config.json"),
                _file_text(directory / "processor_config.json"),
                self.size_kwargs,
                "decoded at the processor's size",  # parsing.images.decode's draft/reduce
            ]
        )
        self.signature = hashlib.sha256(blob.encode()).hexdigest()[:32]
        self.merge_size = int(
            getattr(getattr(config, "vision_config", None), "spatial_merge_size", 1) or 1
        )
        self.cache_entries, self.cache_bytes = options.cache_entries, options.cache_bytes
        # Engine thread only: image digest -> evaluated vision features, least recent first.
        self.features: OrderedDict[str, mx.array] = OrderedDict()
        self.features_nbytes = 0
        self.feature_hits = 0
        self.feature_misses = 0
        from mlx_vlm.utils import should_add_special_tokens

        self.add_special_tokens = should_add_special_tokens(self.model_type, processor)
        pad = getattr(tokenizer, "pad_token", None)
        if pad is None and getattr(tokenizer, "eos_token", None) is not None:
            tokenizer.pad_token = tokenizer.eos_token  # as mlx-vlm's prepare_inputs does
        for component in (
            processor,
            getattr(processor, "image_processor", None),
            getattr(processor, "video_processor", None),
        ):
            if component is not None:
                seam_vision.numpy_on_workers(component)
        quiet = logging.getLogger("transformers.processing_utils")
        if _QUIET not in quiet.filters:
            quiet.addFilter(_QUIET)

    def _video_refusal(self, processor: Any) -> str:
        """Why this model takes no ``PredictOptions.Videos`` ("" = it takes them): its
        processor makes no video inputs (mlx-vlm's ``processor_handles_video``), or this
        backend knows no video placeholder for the family (Qwen2-VL and Qwen2.5-VL, whose
        mlx-vlm model embeds ``pixel_values_videos``, have one)."""
        from mlx_vlm.generate.video import processor_handles_video

        if not self.family.video_placeholder or not isinstance(self.video_token_id, int):
            return f"the backend runs no video through {self.model_type} models"
        if not processor_handles_video(processor):
            return f"mlx-vlm's processor of this {self.model_type} model takes no videos"
        return ""

    @staticmethod
    def _video_sampling(processor: Any, max_frames: int) -> FrameSampling:
        """How frames are sampled: mlx-vlm's ``resolve_video_sampling`` (the processor's
        fps / min / max frames, else mlx-vlm's defaults), max frames capped by the option
        ``max_video_frames``."""
        from mlx_vlm.utils import resolve_video_sampling

        got = resolve_video_sampling(processor, {})
        return FrameSampling(
            fps=float(got.fps or 2.0),
            min_frames=int(got.min_frames or 1),
            max_frames=min(int(got.max_frames or max_frames), max_frames),
            frame_factor=int(got.frame_factor or 1),
        )

    # -- prompt worker threads (no MLX)
    def frames(self, video: VideoData, budget: int) -> Any:
        """The sampled frames of ``video`` (uint8 (T, H, W, 3), RGB): a video file through
        mlx-vlm's own reader (``mlx_vlm.utils.load_video``, OpenCV) with this model's
        sampling, an animated image through PIL with the same rule
        (`parsing.videos.decode_frames`). ``budget``: the pixels the request's frames may
        still hold, checked before any frame is decoded. ValueError naming the entry."""
        if video.format not in videos_mod.CONTAINERS:
            return videos_mod.decode_frames(
                video, self.video_sampling, self.limits.max_pixels, budget
            )
        return _file_frames(video, self.video_sampling, self.limits.max_pixels, budget)

    def render_messages(self, messages: list, **kwargs: Any) -> str:
        """The chat template over ``messages`` as they are (content parts included: a
        video part is {"type": "video"}), through mlx-vlm's ``get_chat_template``."""
        from mlx_vlm.prompt_utils import get_chat_template

        add = kwargs.pop("add_generation_prompt", True)
        # A string here (tokenize is not asked for); mlx-vlm does not type its result.
        return cast(str, get_chat_template(self.processor, messages, add, **kwargs))

    def render(self, prompt: Any, num_images: int, **kwargs: Any) -> str:
        """mlx-vlm's ``apply_chat_template`` (a string or messages), placing ``num_images``
        images as mlx-vlm does: explicit image parts where they are, the rest at the end of
        the last user message."""
        from mlx_vlm.prompt_utils import apply_chat_template

        # A string (mlx-vlm types its result as messages, a string or Any).
        return cast(
            str,
            apply_chat_template(
                self.processor, self.model.config, prompt, num_images=num_images, **kwargs
            ),
        )

    def process(self, text: str, images: list, videos: list | None = None) -> dict:
        """The processor's output for ``text``, PIL ``images`` and ``videos`` (uint8 frame
        arrays (T, H, W, 3), as mlx-vlm's ``prepare_inputs`` hands decoded frames on), as
        numpy: input_ids, attention_mask, pixel_values and the family's extras (e.g.
        image_grid_thw; pixel_values_videos and video_grid_thw for videos)."""
        from mlx_vlm.utils import process_inputs

        more = {"videos": videos} if videos else {}
        with seam_vision.numpy_outputs():
            out = process_inputs(
                self.processor,
                prompts=[text],
                images=images or None,
                add_special_tokens=self.add_special_tokens,
                return_tensors="np",
                **self.size_kwargs,
                **more,
            )
        data = dict(out)
        if "images" in data and "pixel_values" not in data:
            data["pixel_values"] = data.pop("images")
        return data

    # -- engine thread
    def cache_info(self) -> dict[str, int]:
        return {
            "entries": len(self.features),
            "bytes": self.features_nbytes,
            "hits": self.feature_hits,
            "misses": self.feature_misses,
        }


def _file_frames(video: VideoData, sampling: FrameSampling, max_pixels: int, budget: int) -> Any:
    """`VisionParts.frames` of a video file: its header read with OpenCV (size, frame
    count, rate) and bounded as PIL's animations are, then mlx-vlm's ``load_video`` on a
    temporary copy (it reads a path), which samples and decodes only the frames it takes."""
    import tempfile

    import cv2
    import numpy as np
    from mlx_vlm.utils import VideoSampling, load_video

    field = f"PredictOptions.Videos[{video.index}]"
    with tempfile.NamedTemporaryFile(suffix=".video") as tmp:
        tmp.write(video.data)
        tmp.flush()
        cap = cv2.VideoCapture(tmp.name)
        try:
            if not cap.isOpened():
                raise ValueError(f"{field} cannot be decoded as a video file ({video.format})")
            width = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
            height = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
            total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
            fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0) or 1.0  # mlx-vlm's fallback
        finally:
            cap.release()
        if width <= 0 or height <= 0 or total <= 0:
            raise ValueError(f"{field} has no frames ({width}x{height}, {total} frames)")
        if width * height > max_pixels:
            raise ValueError(
                f"{field} is {width}x{height} = {width * height} pixels a frame, more than "
                f"the {max_pixels} allowed (load option max_image_pixels)"
            )
        if total < 2:
            raise ValueError(f"{field} has one frame: send a still image in Images")
        try:
            wanted = videos_mod.frame_indices(total, total / fps, sampling)
        except ValueError as exc:
            raise ValueError(f"{field}: {exc}") from None
        if len(wanted) * width * height > budget:
            raise ValueError(
                f"{field}: its {len(wanted)} sampled frames of {width}x{height} hold "
                f"{len(wanted) * width * height} pixels, more than the {budget} the request "
                "has left; send shorter or smaller videos, or lower the load option "
                "max_video_frames"
            )
        how = VideoSampling(
            fps=sampling.fps,
            min_frames=sampling.min_frames,
            max_frames=sampling.max_frames,
            frame_factor=sampling.frame_factor,
        )
        try:
            with images_mod.DECODE_SLOTS:
                clip, _ = load_video(tmp.name, how)
        except Exception as exc:  # mlx-vlm raises ValueError; OpenCV cv2.error
            raise ValueError(
                f"{field} cannot be decoded as a video file ({video.format}): "
                f"{type(exc).__name__}: {str(exc)[:200]}"
            ) from None
    return np.ascontiguousarray(np.asarray(clip, dtype=np.uint8).transpose(0, 2, 3, 1))


# --------------------------------------------------------------------------- the view
def _lm_cache_like(layer: Any) -> Any:
    """The mlx-lm cache for one mlx-vlm cache layer (BatchGenerator merges mlx-lm's)."""
    from mlx_lm.models import cache as lm_cache
    from mlx_vlm.models import cache as vlm_cache

    if isinstance(layer, vlm_cache.RotatingKVCache):
        return lm_cache.RotatingKVCache(max_size=layer.max_size, keep=layer.keep)
    if type(layer) is vlm_cache.KVCache:
        return lm_cache.KVCache()
    raise TypeError(f"no mlx-lm cache for mlx-vlm's {type(layer).__name__}")


class LMView(nn.Module):
    """An mlx-lm-style model over a vision-language model's language model (module doc).

    ``vision`` is the `VisionParts` (a plain attribute, not a child module); ``vlm`` the
    whole mlx-vlm model (a child: its parameters are this module's)."""

    def __init__(self, vlm: Any, parts: VisionParts | None = None) -> None:
        super().__init__()
        self.vlm = vlm
        self.vision = parts
        self.mrope = hasattr(vlm.language_model, "get_rope_index")
        # Not an mlx-lm type: no CPU fusion or other per-architecture rewrite applies.
        self.model_type = f"mlx_vlm.{getattr(vlm.config, 'model_type', '')}"

    @property
    def lm(self) -> Any:
        return self.vlm.language_model

    @property
    def layers(self) -> Any:
        lm = self.vlm.language_model
        return lm.layers if hasattr(lm, "layers") else lm.model.layers

    @property
    def args(self) -> Any:
        """The text config (max_position_embeddings: the context length)."""
        return getattr(self.vlm.config, "text_config", self.vlm.config)

    def positions(self, cache: Any, batch: int, length: int) -> mx.array:
        """mRoPE ids (3, B, L) at the cache offset: per row for a batch cache."""
        offset = cache[0].offset if cache else 0
        base = mx.arange(length)[None, :]
        if isinstance(offset, mx.array):
            pos = offset.reshape(-1, 1) + base
        else:
            pos = mx.broadcast_to(base + offset, (batch, length))
        return mx.broadcast_to(pos[None], (3, batch, length))

    def __call__(
        self,
        inputs: mx.array,
        cache: Any = None,
        input_embeddings: mx.array | None = None,
        position_ids: mx.array | None = None,
    ) -> mx.array:
        kwargs = {}
        if self.mrope:
            if position_ids is None:
                position_ids = self.positions(cache, *inputs.shape[:2])
            kwargs["position_ids"] = position_ids
        out = self.vlm.language_model(inputs, inputs_embeds=input_embeddings, cache=cache, **kwargs)
        # mlx-vlm's language models return an output object with .logits, or the array.
        return cast(mx.array, getattr(out, "logits", out))


class LMViewOwnCache(LMView):
    """`LMView` of a language model that makes its own cache (sliding-window layers):
    the same layer kinds, as mlx-lm's cache classes."""

    def make_cache(self) -> list:
        return [_lm_cache_like(layer) for layer in self.vlm.language_model.make_cache()]


def view_of(vlm: Any, parts: VisionParts | None) -> LMView:
    cls = LMViewOwnCache if hasattr(vlm.language_model, "make_cache") else LMView
    view = cls(vlm, parts)
    if isinstance(view, LMViewOwnCache):
        try:
            view.make_cache()
        except TypeError as exc:
            raise ModelLoadError(
                f"{view.model_type}: {exc}; load it with the option vision:false to serve it "
                "text-only"
            ) from None
    return view


# --------------------------------------------------------------------------- loading
def text_only_reason(params: Any, distributed: bool) -> str:
    """Why a vision-language model loads text-only with these load parameters ("" = it
    does not)."""
    if not params.vision.on:
        return "the option vision:false"
    if distributed:
        return "distributed mode"
    if params.lora_adapter:
        return "a LoRA adapter"
    if params.draft_model:
        return "a draft model"
    if params.speculative == "ngram":
        return "n-gram speculation"
    if params.kv_bits is not None:
        return "a quantized KV cache"
    return ""


def load(
    directory: Path,
    *,
    tokenizer_config: dict[str, Any],
    trust_remote_code: bool,
    lazy: bool,
    options: VisionOptions,
) -> tuple[LMView, Any]:
    """Load the vision-language model in ``directory``: (``LMView``, mlx-lm tokenizer).
    Raises ModelLoadError naming the cause (and the option vision:false, which serves
    the model text-only)."""
    import mlx_vlm.utils as vlm_utils
    from mlx_lm.utils import load_tokenizer
    from mlx_vlm.models.base import BaseImageProcessor

    hint = "; the option vision:false loads it text-only through mlx-lm"
    try:
        vlm, processor = vlm_utils.load(
            str(directory), lazy=lazy, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # mlx-vlm raises ValueError/KeyError/FileNotFoundError/...
        raise ModelLoadError(
            f"cannot load vision model {directory} with mlx-vlm: {type(exc).__name__}: "
            f"{str(exc)[:500]}{hint}"
        ) from exc
    if isinstance(getattr(processor, "image_processor", None), BaseImageProcessor):
        raise ModelLoadError(
            f"vision model {directory} ({vlm.config.model_type}) uses mlx-vlm's legacy image "
            f"processor, which this backend's image path does not support{hint}"
        )
    try:
        parts = VisionParts(vlm, processor, Path(directory), options)
    except ValueError as exc:  # a bad option
        raise ModelLoadError(str(exc)) from None
    config = _read_config(Path(directory)) or {}
    eos = config.get("eos_token_id")
    if eos is None:
        eos = (config.get("text_config") or {}).get("eos_token_id")
    try:
        tokenizer = load_tokenizer(directory, tokenizer_config, eos_token_ids=eos)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot load the tokenizer of {directory}: {type(exc).__name__}: {exc}"
        ) from exc
    if not getattr(tokenizer, "has_chat_template", False):
        template = getattr(processor, "chat_template", None)
        if isinstance(template, str) and template:
            # Text-only chats render with the processor's template (chat_template.json).
            # (The wrapper sets both on the Hugging Face tokenizer it wraps.)
            tokenizer.chat_template = template
            tokenizer.has_chat_template = True
    view = view_of(vlm, parts)
    logger.info(
        "vision model %s (%s): images through mlx-vlm, media marker %s",
        directory.name,
        parts.model_type,
        MEDIA_MARKER,
    )
    return view, tokenizer
