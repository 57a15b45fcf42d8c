"""Image prompts on the prompt worker threads: render, decode and preprocess images, and
the cache identity of every token (no MLX here: the engine thread owns it).

`prepare` is what `Engine.submit` runs off the event loop and off the engine thread for
every request: a request without images goes to `prompting.render.prepare_prompt` as before;
one with images becomes a `VisionPrompt`:

- Where the images go. A raw `Prompt` with media markers (``<__media__>``, what LocalAI
  writes, and what ModelMetadata reports as this backend's marker): each marker becomes
  the family's image placeholder, one image per marker, in order. A raw `Prompt` without
  markers is wrapped as one user message and rendered with mlx-vlm's
  ``apply_chat_template(..., num_images=N)``, as LocalAI's own mlx-vlm backend does.
  `Messages` (UseTokenizerTemplate) render the same way: a marker inside a user message
  puts an image there; images left over go to the end of the last user message (mlx-vlm's
  rule; LocalAI sends message text without markers). A trailing assistant message is
  continued, as for text. The family's own image tokens typed as text are refused: only
  markers place images.
- Decoding (`parsing.images.decode`: bounded pixels, at the processor's size, the
  request's total checked from the headers first by `parsing.images.check_request`) and
  the processor (mlx-vlm's, numpy output), whose token ids are the prompt (image tokens
  expanded); ``prompt_tokens`` counts them. The decoded pictures are closed once the
  processor has made its arrays.
- Cache identity (``key_ids``, what the prompt cache is keyed by): the token ids, with each
  image's tokens replaced by ids derived from the image's SHA-256, its token count and the
  processor's signature (never below 2**100, so never a vocabulary id), so the same image
  reuses a cached prefix and a different one never does, across restarts too (the disk
  tier). For Qwen2-VL the prefill positions of the whole prompt shift by its mRoPE delta
  (`loading.vision`), so the first key id also carries the delta: a prompt with another
  delta (other images) shares no prefix with it, not even its text before the images.
  A prefix that ends inside an image's tokens is never stored (`VisionPrompt.key_tokens`)
  or reused (`engine.vision`). mRoPE families whose delta cannot be computed here get a
  one-off first key id and are never stored: no reuse, never a wrong one.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, TypeVar

import jinja2
import numpy as np

from decoding.output import initial_state_for
from loading.vision import MEDIA_MARKER
from params import PromptSpec
from parsing import images as images_mod
from prompting import fit
from prompting import render as prompt_mod

T = TypeVar("T")

VIRTUAL_BASE = 1 << 100  # key ids of image tokens are above every vocabulary id
TAG_BASE = 1 << 99  # first key id of a prompt whose positions shift (mRoPE delta)
ONE_OFF_BASE = 1 << 98  # first key id of a prompt that must share nothing (never stored)
_IMAGE_BITS = 24  # tokens per image < 2**24 in key ids


@dataclass(frozen=True)
class VisionPrompt:
    """An image prompt, prepared off the engine thread (numpy arrays only).

    ``input_ids``: the processor's token ids (what the model reads); ``key_ids``: the
    same positions as the prompt cache keys them (module doc); ``spans``: [start, end)
    of each image's tokens (ascending); ``digests``: each image's SHA-256; ``pixel_values``
    / ``attention_mask`` / ``extra``: the processor's output for the whole prompt
    (``extra``: e.g. image_grid_thw); ``pixels`` / ``image_extra``: one image's part of
    them (None when the family's tower runs on all images at once); ``rope_delta``: the
    mRoPE position shift computed from the image grids (0 without mRoPE or when unknown);
    ``cacheable``: False when the prompt may share no cache entry.
    """

    input_ids: tuple[int, ...]
    key_ids: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    digests: tuple[str, ...]
    pixel_values: Any
    attention_mask: Any
    extra: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    pixels: tuple[Any, ...] | None = None
    image_extra: tuple[MappingProxyType, ...] | None = None
    rope_delta: int = 0
    cacheable: bool = True

    def inside_image(self, n: int) -> bool:
        """Whether a prefix of ``n`` tokens ends strictly inside an image's tokens."""
        return any(start < n < end for start, end in self.spans)

    def key_tokens(self, tokens: Any) -> list[int] | None:
        """The cache key of ``tokens`` (this prompt's ids, a prefix of them, or them plus
        generated ones): image and first positions as ``key_ids``; None when the tokens
        must not be stored (they end inside an image, or the prompt is not cacheable)."""
        tokens = [int(t) for t in tokens]
        if not self.cacheable or self.inside_image(len(tokens)):
            return None
        head = min(len(tokens), len(self.input_ids))
        if tokens[:head] != list(self.input_ids[:head]):
            return None  # not this prompt's tokens: never store them under its keys
        return [*self.key_ids[:head], *tokens[head:]]

    def images_in(self, start: int, stop: int) -> list[int]:
        """Indices of the images with tokens in [start, stop)."""
        return [i for i, (s, e) in enumerate(self.spans) if s < stop and e > start]


@dataclass(frozen=True)
class VisionPreparedPrompt(prompt_mod.PreparedPrompt):
    """`PreparedPrompt` of an image request: ``token_ids`` are the key ids (what the
    scheduler looks the prompt cache up with; as many as the model reads), ``vision``
    the rest."""

    vision: VisionPrompt | None = None


def prepare(
    spec: PromptSpec,
    loaded: Any,
    check_text: Callable[[str], None] | None = None,
    checkpoints: bool = False,
) -> prompt_mod.PreparedPrompt:
    """The prepared prompt of ``spec`` for the `LoadedModel` ``loaded`` (module doc), a
    text prompt's by `prompt.prepare_prompt`. ``check_text``: called with the rendered
    text before tokenizing (`prompting.fit.check_text`). ValueError (INVALID_ARGUMENT)
    naming the field: images sent to a text-only model (`prompting.fit.check_images`),
    markers and images that do not pair up, an image that cannot be decoded or is too
    large, the processor or the template refusing the prompt, a prompt too long.
    """
    if spec.videos:
        return prepare_videos(spec, loaded, check_text)
    if not spec.images:
        return prompt_mod.prepare_prompt(spec, loaded.tokenizer, check_text, checkpoints)
    fit.check_images(loaded, len(spec.images))
    parts = loaded.vision
    limit, target = parts.limits.max_pixels, parts.decode_target
    images_mod.check_request(spec.images, limit, target)  # headers only: nothing decoded yet
    text = render(spec, parts, len(spec.images))
    if check_text is not None:
        check_text(text)
    pictures = [images_mod.decode(image, limit, target) for image in spec.images]
    try:
        data = _process("PredictOptions.Images", partial(parts.process, text, pictures))
    finally:  # the processor's arrays are what the request keeps: free the pictures now
        for picture in pictures:
            picture.close()
        del pictures
    vision = build(parts, spec.images, data)
    return _prepared(loaded, text, vision)


def _prepared(loaded: Any, text: str, vision: VisionPrompt) -> VisionPreparedPrompt:
    tokenizer = loaded.tokenizer
    state = (
        initial_state_for(tokenizer, vision.input_ids) if hasattr(tokenizer, "has_thinking") else ""
    )
    return VisionPreparedPrompt(
        text=text, token_ids=vision.key_ids, initial_state=state or "normal", vision=vision
    )


# --------------------------------------------------------------------------- videos
def check_videos(loaded: Any) -> Any:
    """The `VisionParts` of ``loaded`` when it takes videos; else ValueError
    (INVALID_ARGUMENT) saying why: a text-only model, or a vision model whose family or
    processor takes none (`VisionParts.video_refusal`)."""
    parts = loaded.vision
    if parts is None:
        reason = getattr(loaded.model, "text_only_reason", "")
        raise ValueError(
            f"PredictOptions.Videos: the loaded model {loaded.name!r} serves text only"
            + (f" (its vision part is off: {reason})" if reason else "")
            + "; videos need a video-language model (Qwen2-VL, Qwen2.5-VL)"
        )
    if parts.video_refusal:
        raise ValueError(
            f"PredictOptions.Videos: the loaded model {loaded.name!r} takes no videos "
            f"({parts.video_refusal}); send frames as PredictOptions.Images, or use a "
            "Qwen2-VL or Qwen2.5-VL model"
        )
    return parts


def prepare_videos(
    spec: PromptSpec, loaded: Any, check_text: Callable[[str], None] | None = None
) -> VisionPreparedPrompt:
    """The prepared prompt of a request with ``PredictOptions.Videos``: the template
    renders a video part per video (`render_videos`), each video's frames are sampled
    and decoded (`parsing.videos`, as mlx-vlm samples them), the processor makes the video
    inputs, and the prompt runs through the same vision path as images, whole (the tower
    over all its videos at once) and never cached (its mRoPE positions depend on the
    frames' grid; `build`). ValueError (INVALID_ARGUMENT) naming the field: a model that
    takes no videos (`check_videos`), Images and Videos in one request (mlx-vlm's
    Qwen2-VL embeds either), markers that do not pair up, undecodable or too large
    videos, the processor refusing them, a prompt too long."""
    parts = check_videos(loaded)
    if spec.images:
        raise ValueError(
            "PredictOptions.Images and PredictOptions.Videos in one request: mlx-vlm's "
            f"{parts.model_type} embeds either images or videos in a prompt; send them in "
            "separate requests"
        )
    text = render_videos(spec, parts, len(spec.videos))
    if check_text is not None:
        check_text(text)
    budget = images_mod.MAX_REQUEST_PIXELS
    frames = []
    for video in spec.videos:
        clip = parts.frames(video, budget)
        budget -= int(clip.shape[0]) * int(clip.shape[1]) * int(clip.shape[2])
        frames.append(clip)
    try:
        data = _process("PredictOptions.Videos", partial(parts.process, text, [], frames))
    finally:
        del frames
    vision = build(parts, spec.videos, data, parts.video_token_id, "PredictOptions.Videos")
    return _prepared(loaded, text, vision)


# LocalAI's video marker in a prompt it renders itself (core/templates/multimodal.go
# DefaultMultiModalTemplate: "[vid-{{.ID}}]"), one per video in order.
_VIDEO_MARKER = re.compile(r"\[vid-\d+\]")


def _video_parts(n: int, text: str) -> list[dict[str, str]]:
    # As mlx-vlm's _format_video_message: the videos first, then the text.
    return [{"type": "video"} for _ in range(n)] + ([{"type": "text", "text": text}] * bool(text))


def render_videos(spec: PromptSpec, parts: Any, n: int) -> str:
    """The prompt text with one video placeholder per video. A raw `Prompt` with LocalAI's
    ``[vid-N]`` markers: each becomes the family's video placeholder, in order; without
    markers it is one user message with the videos before its text (mlx-vlm's video
    message). `Messages`: the videos go before the text of the last user message. Media
    markers (image slots) and the family's own tokens typed as text are refused."""
    if spec.messages is None:
        _check_literals(spec.prompt, parts, "PredictOptions.Prompt")
        if MEDIA_MARKER in spec.prompt:
            raise ValueError(
                f"PredictOptions.Prompt has a media marker ({MEDIA_MARKER}, an image slot) "
                "but the request sends Videos: mark videos with [vid-0], [vid-1]..."
            )
        markers = _VIDEO_MARKER.findall(spec.prompt)
        if markers:
            if len(markers) != n:
                raise ValueError(
                    f"PredictOptions.Prompt has {len(markers)} video markers ([vid-N]) but "
                    f"PredictOptions.Videos has {n} videos: send one video per marker"
                )
            return _VIDEO_MARKER.sub(lambda _: parts.family.video_placeholder, spec.prompt)
        tools = {"tools": spec.template_tools} if spec.template_tools else {}
        return _render_parts(
            parts, [{"role": "user", "content": _video_parts(n, spec.prompt)}], **tools
        )
    messages = [copy.deepcopy(dict(m)) for m in spec.messages]
    last_user = -1
    for i, message in enumerate(messages):
        content = message.get("content") or ""
        _check_literals(content, parts, f"PredictOptions.Messages[{i}].content")
        if MEDIA_MARKER in content:
            raise ValueError(
                f"PredictOptions.Messages[{i}] has a media marker ({MEDIA_MARKER}, an image "
                "slot) but the request sends Videos, no Images"
            )
        if message["role"] == "user":
            last_user = i
    if last_user < 0:
        raise ValueError(
            "PredictOptions.Videos: the messages have no user message to attach them to"
        )
    messages[last_user]["content"] = _video_parts(n, messages[last_user].get("content") or "")
    if spec.continue_final:
        last = messages[-1]
        last["content"] = f"{last.get('content') or ''}{prompt_mod._CONTINUE_MARK}"
    kwargs: dict[str, Any] = dict(spec.template_kwargs)
    if spec.template_tools:
        kwargs["tools"] = spec.template_tools
    text = _render_parts(parts, messages, add_generation_prompt=not spec.continue_final, **kwargs)
    return prompt_mod.cut_continued(text, spec.continue_final)


def _render_parts(parts: Any, messages: list, **kwargs: Any) -> str:
    try:
        text = parts.render_messages(messages, **kwargs)
    except jinja2.TemplateError as err:
        raise ValueError(f"PredictOptions.Messages rejected by the chat template: {err}") from None
    if not isinstance(text, str):
        raise ValueError("PredictOptions.Videos: the chat template rendered no text")
    return text


# --------------------------------------------------------------------------- rendering
def _check_literals(text: str, parts: Any, field_name: str) -> None:
    for literal in parts.family.literals:
        if literal and literal in text:
            raise ValueError(
                f"{field_name} contains the model's image token {literal} as text; mark "
                f"where an image goes with {MEDIA_MARKER} (one per image in "
                "PredictOptions.Images)"
            )


def _split_markers(content: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for i, piece in enumerate(content.split(MEDIA_MARKER)):
        if i:
            out.append({"type": "image"})
        if piece:
            out.append({"type": "text", "text": piece})
    return out


def _template(parts: Any, prompt: Any, n: int, **kwargs: Any) -> str:
    try:
        return str(parts.render(prompt, n, **kwargs))
    except jinja2.TemplateError as err:
        raise ValueError(f"PredictOptions.Messages rejected by the chat template: {err}") from None
    except ValueError as err:  # e.g. a single-image family given several
        raise ValueError(f"PredictOptions.Images: {err}") from None


def render(spec: PromptSpec, parts: Any, n: int) -> str:
    """The prompt text with one image placeholder per image (module doc)."""
    if spec.messages is None:
        _check_literals(spec.prompt, parts, "PredictOptions.Prompt")
        markers = spec.prompt.count(MEDIA_MARKER)
        if markers:
            if markers != n:
                raise ValueError(
                    f"PredictOptions.Prompt has {markers} media markers ({MEDIA_MARKER}) but "
                    f"PredictOptions.Images has {n} images: send one image per marker"
                )
            return spec.prompt.replace(MEDIA_MARKER, parts.family.placeholder)
        # As LocalAI's mlx-vlm backend: the prompt as one user message, images with it.
        tools = {"tools": spec.template_tools} if spec.template_tools else {}
        return _template(parts, [{"role": "user", "content": spec.prompt}], n, **tools)
    messages = [copy.deepcopy(dict(m)) for m in spec.messages]
    placed, last_user = 0, -1
    for i, message in enumerate(messages):
        content = message.get("content") or ""
        _check_literals(content, parts, f"PredictOptions.Messages[{i}].content")
        if message["role"] == "user":
            last_user = i
        if MEDIA_MARKER in content:
            if message["role"] != "user":
                raise ValueError(
                    f"PredictOptions.Messages[{i}] ({message['role']}) has a media marker: "
                    "images go in user messages only"
                )
            placed += content.count(MEDIA_MARKER)
            message["content"] = _split_markers(content)
    if placed > n:
        raise ValueError(
            f"PredictOptions.Messages have {placed} media markers ({MEDIA_MARKER}) but "
            f"PredictOptions.Images has {n} images: send one image per marker"
        )
    if placed < n and last_user < 0:
        raise ValueError(
            "PredictOptions.Images: the messages have no user message to attach them to"
        )
    if spec.continue_final:
        last = messages[-1]
        content = last.get("content") or ""
        last["content"] = f"{content}{prompt_mod._CONTINUE_MARK}"
    kwargs: dict[str, Any] = dict(spec.template_kwargs)
    if spec.template_tools:
        kwargs["tools"] = spec.template_tools
    text = _template(parts, messages, n, add_generation_prompt=not spec.continue_final, **kwargs)
    return prompt_mod.cut_continued(text, spec.continue_final)


# --------------------------------------------------------------------------- tokens
def _array(value: Any) -> Any:
    if value is None or isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], np.ndarray):
        return np.stack(value)
    return np.asarray(value)


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for pos, t in enumerate(ids):
        if t != token:
            continue
        if runs and runs[-1][1] == pos:
            runs[-1] = (runs[-1][0], pos + 1)
        else:
            runs.append((pos, pos + 1))
    return runs


def image_key(signature: str, digest: str, tokens: int) -> int:
    """The base key id of an image's tokens: from the processor signature, the image's
    digest and its token count (an image processed to another size gets another)."""
    h = hashlib.sha256(f"{signature}:{digest}:{tokens}".encode()).digest()
    return VIRTUAL_BASE + (int.from_bytes(h[:12], "big") << _IMAGE_BITS)


def qwen_rope_delta(grids: Any, merge: int) -> int:
    """Qwen2-VL's mRoPE delta (max position + 1 - length) of a prompt with images of
    ``grids`` (t, h, w patches): each image of t x h' x w' tokens (h' = h / merge) spans
    max(t, h', w') positions."""
    delta = 0
    for t, h, w in np.asarray(grids).reshape(-1, 3).tolist():
        hh, ww = h // merge, w // merge
        delta += max(t, hh, ww) - t * hh * ww
    return int(delta)


def build(
    parts: Any,
    images: tuple,
    data: dict,
    token_id: int | None = None,
    field_name: str = "PredictOptions.Images",
) -> VisionPrompt:
    """The `VisionPrompt` of the processor's output ``data`` for ``images`` (or videos:
    ``token_id`` the family's video token, ``field_name`` their field)."""
    ids = [int(t) for t in np.asarray(data["input_ids"]).reshape(-1).tolist()]
    n = len(images)
    spans = _runs(ids, parts.image_token_id if token_id is None else token_id)
    pixel_values = _array(data.get("pixel_values"))
    mask = _array(data.get("attention_mask"))
    extra = {
        k: _array(v)
        for k, v in data.items()
        if k not in ("input_ids", "attention_mask", "pixel_values") and v is not None
    }
    family = parts.family
    grids = extra.get("image_grid_thw")
    pixels: tuple | None = None
    image_extra: tuple | None = None
    if family.tower == "qwen" and grids is not None and len(grids) == n:
        counts = [int(np.prod(g)) for g in grids]
        per_image = [c // (parts.merge_size**2) for c in counts]
        # One contiguous run per image (the placeholder wraps each in vision_start/end).
        if [e - s for s, e in spans] != per_image:
            raise ValueError(
                f"PredictOptions.Images: the prompt has image tokens for {len(spans)} images "
                f"({[e - s for s, e in spans]} tokens) but the processor made {per_image}"
            )
        bounds = np.cumsum([0, *counts])
        pixels = tuple(pixel_values[bounds[i] : bounds[i + 1]] for i in range(n))
        image_extra = tuple(
            MappingProxyType({"image_grid_thw": grids[i : i + 1]}) for i in range(n)
        )
    elif family.tower == "gemma3" and pixel_values is not None and len(pixel_values) == n:
        pixels = tuple(pixel_values[i : i + 1] for i in range(n))
    if len(spans) != n:
        what = "videos" if token_id is not None else "images"
        raise ValueError(
            f"{field_name} has {n} {what} but the prompt has room for {len(spans)} "
            f"(the chat template or the media markers placed {len(spans)})"
        )
    if ids and spans and spans[-1][1] >= len(ids):
        raise ValueError("PredictOptions.Prompt ends with an image: add text after it")
    delta, cacheable = 0, True
    if parts.mrope:
        if family.rope_delta and grids is not None:
            delta = qwen_rope_delta(grids, parts.merge_size)
        else:
            cacheable = False
    key = list(ids)
    for image, (start, end) in zip(images, spans, strict=True):
        base = image_key(parts.signature, image.digest, end - start)
        key[start:end] = range(base, base + (end - start))
    if not cacheable:
        key[0] = ONE_OFF_BASE + int.from_bytes(os.urandom(12), "big")
    elif delta:
        h = hashlib.sha256(f"rope:{delta}:{key[0]}".encode()).digest()
        key[0] = TAG_BASE + int.from_bytes(h[:12], "big")
    return VisionPrompt(
        input_ids=tuple(ids),
        key_ids=tuple(key),
        spans=tuple(spans),
        digests=tuple(image.digest for image in images),
        pixel_values=pixel_values,
        attention_mask=mask,
        extra=MappingProxyType(extra),
        pixels=pixels,
        image_extra=image_extra,
        rope_delta=delta,
        cacheable=cacheable,
    )


def _process(name: str, call: Callable[[], T]) -> T:
    """Run the model's processor on a request's media; its failures become ValueErrors
    naming the field ``name`` (processors raise TypeError, IndexError... on odd input)."""
    try:
        return call()
    except ValueError as exc:
        raise ValueError(f"{name}: the model's processor refused them: {exc}") from None
    except Exception as exc:
        raise ValueError(
            f"{name}: the model's processor failed on them: {type(exc).__name__}: {str(exc)[:300]}"
        ) from None
