"""Images of a request without a model: base64 reading and its bounds (parsing/images.py),
PredictOptions.Images in the parsed request (params.py), the cache identity of image
tokens (engine/vision_prompt.py), hub downloads fetching processor files, and images sent
to a text-only model over real gRPC (a scripted model)."""

from __future__ import annotations

import base64
import fnmatch
import io

import grpc
import numpy as np
import pytest
from helpers import greedy
from inprocess import InProcessServer
from PIL import Image
from scripted import ScriptedModel
from toy_tokenizer import toy_tokenizer

import backend_pb2 as pb
import params
from engine import vision_prompt as vp
from parsing import images
from seam.tokenizer import vocab_size


def png(w: int = 8, h: int = 8, color=(255, 0, 0), fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format=fmt)
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --------------------------------------------------------------------------- reading
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_formats_are_read_and_hashed(fmt):
    data = png(fmt=fmt)
    image = images.read_image(0, b64(data))
    assert image.format == fmt and image.data == data
    assert image.digest == images.read_image(3, b64(data)).digest  # the bytes' identity
    assert images.decode(image).size == (8, 8)


def test_data_url_whitespace_and_urlsafe_base64_are_tolerated():
    data = png()
    text = b64(data)
    assert images.read_image(0, f"data:image/png;base64,{text}").data == data
    assert (
        images.read_image(0, "\n".join(text[i : i + 10] for i in range(0, len(text), 10))).data
        == data
    )
    urlsafe = base64.urlsafe_b64encode(data).decode().rstrip("=")
    assert images.read_image(0, urlsafe).data == data


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("not base64 at all!", "not valid base64"),
        ("https://example.com/cat.png", "does not fetch URLs"),
        ("file:///etc/passwd", "does not fetch URLs"),
        ("data:image/png,abc", "without ';base64,'"),
        (b64(b"GIF89a" + b"\0" * 20), "not a PNG, JPEG or WebP"),
    ],
)
def test_bad_entries_name_their_index(text, words):
    with pytest.raises(ValueError, match=r"PredictOptions\.Images\[2\]") as err:
        images.read_image(2, text)
    assert words in str(err.value)


def test_bytes_count_and_pixels_are_bounded():
    data = png(64, 64)
    with pytest.raises(ValueError, match="limit per image"):
        images.read_image(0, b64(data), max_bytes=len(data) - 1)
    with pytest.raises(ValueError, match="more than the 2 a request"):
        images.read_images([b64(data)] * 3, max_images=2)
    with pytest.raises(ValueError, match=r"Images\[0\] is 64x64 = 4096 pixels.*max_image_pixels"):
        images.decode(images.read_image(0, b64(data)), max_pixels=4095)


def test_undecodable_image_names_its_index():
    broken = png()[:40]  # the PNG signature, then a truncated file
    image = images.read_image(1, b64(broken))
    with pytest.raises(ValueError, match=r"Images\[1\] cannot be decoded as a PNG"):
        images.decode(image)


# --------------------------------------------------------------------------- decoded size
GEMMA = images.DecodeTarget(height=896, width=896)


def noise(w: int, h: int, fmt: str, orientation: int = 1) -> images.ImageData:
    rng = np.random.default_rng(0)
    img = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    buf = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = orientation
    img.save(buf, format=fmt, exif=exif.tobytes())
    return images.read_image(0, b64(buf.getvalue()))


def test_decode_target_factor():
    assert GEMMA.factor(6300, 6300) == 7 and GEMMA.factor(900, 6300) == 1
    assert images.DecodeTarget(max_pixels=50176).factor(6300, 6300) == 28  # 225 x 225
    assert images.DecodeTarget(shortest_edge=336).factor(4000, 3000) == 8
    assert images.DecodeTarget(longest_edge=1000).factor(4000, 3000) == 4
    assert images.DecodeTarget().factor(6300, 6300) == 1  # nothing known: full size


@pytest.mark.parametrize(
    ("fmt", "orientation", "want"),
    [
        ("JPEG", 1, (1000, 938)),  # libjpeg at 1/2 (2000x1875), then reduced by 2
        ("PNG", 1, (1000, 938)),  # decoded whole, reduced by 2
        ("JPEG", 6, (938, 1000)),  # rotated by its EXIF orientation, as mlx-vlm's loader
    ],
)
def test_decode_keeps_no_more_than_the_processor_needs(fmt, orientation, want):
    image = noise(2000, 1875, fmt, orientation)
    target = images.DecodeTarget(height=900, width=900)
    got = images.decode(image, target=target)
    assert got.mode == "RGB" and got.size == want
    assert images.held_size(2000, 1875, fmt, target, orientation == 6) == want
    assert images.check_request([image], target=target) == want[0] * want[1]
    # Without a target, the full picture, rotated as mlx-vlm's load_image does.
    full = images.decode(image)
    assert full.size == ((1875, 2000) if orientation == 6 else (2000, 1875))


def test_a_request_whose_images_would_hold_too_many_pixels_is_refused_before_decoding(
    monkeypatch,
):
    decoded = []
    monkeypatch.setattr(images, "decode", lambda *a, **k: decoded.append(a))
    batch = [noise(400, 300, "PNG")] * 3
    assert images.check_request(batch, 120_000, max_request_pixels=360_000) == 360_000
    with pytest.raises(ValueError, match=r"the 3 images hold 360000 pixels once decoded") as e:
        images.check_request(batch, 120_000, max_request_pixels=359_999)
    assert "send fewer or smaller images" in str(e.value) and not decoded
    # One image at max_image_pixels always fits.
    assert images.check_request(batch[:1], max_pixels=120_000, max_request_pixels=1) == 120_000
    with pytest.raises(ValueError, match=r"Images\[0\] is 400x300 = 120000 pixels"):
        images.check_request(batch, max_pixels=119_999)


def test_alpha_and_grey_images_decode_to_rgb():
    buf = io.BytesIO()
    Image.new("LA", (4, 4)).save(buf, format="PNG")
    assert images.decode(images.read_image(0, b64(buf.getvalue()))).mode == "RGB"


def test_limits_come_from_load_options():
    def vision(*options: str) -> images.VisionOptions:
        return params.load_params(pb.ModelOptions(Model="m", Options=list(options))).vision

    assert vision() == images.VisionOptions()  # the defaults
    assert vision().limits == images.ImageLimits(16, 20 << 20, 40_000_000)
    got = vision("max_images:2", "max_image_bytes:1e6", "max_image_pixels:4096")
    assert got.limits == images.ImageLimits(2, 10**6, 4096)
    got = vision("vision:off", "vision_max_pixels:1024", "vision_cache_entries:0")
    assert (got.on, got.max_pixels, got.cache_entries) == (False, 1024, 0)
    assert vision("vision_cache_bytes:0").cache_bytes == 0
    # Checked at load (once), whatever the model: each names the option.
    for bad in (
        "max_image_pixels:0",
        "max_images:1.5",
        "vision_max_pixels:0",
        "vision_cache_entries:-1",
        "vision_cache_bytes:true",
        "vision:maybe",
    ):
        with pytest.raises(ValueError, match=f"option {bad.split(':')[0]} "):
            vision(bad)


# --------------------------------------------------------------------------- the request
def test_images_are_part_of_the_prompt_spec():
    req = pb.PredictOptions(Prompt="<__media__> what?", Images=[b64(png())])
    spec = params.parse_request(req).prompt
    assert len(spec.images) == 1 and spec.images[0].format == "PNG"
    load = params.load_params(pb.ModelOptions(Model="m", Options=["max_images:1"]))
    with pytest.raises(ValueError, match="max_images"):
        params.parse_request(pb.PredictOptions(Prompt="x", Images=[b64(png())] * 2), load)
    # Videos are read with the prompt too (tests/fast/test_videos.py).
    with pytest.raises(ValueError, match=r"PredictOptions\.Videos\[0\] is not an animated"):
        params.parse_request(pb.PredictOptions(Prompt="x", Videos=["AAAA"]))


# --------------------------------------------------------------------------- cache keys
def _prompt(ids, spans, cacheable=True):
    key = list(ids)
    for n, (s, e) in enumerate(spans):
        base = vp.image_key("sig", f"d{n}", e - s)
        key[s:e] = range(base, base + e - s)
    return vp.VisionPrompt(
        input_ids=tuple(ids),
        key_ids=tuple(key),
        spans=tuple(spans),
        digests=tuple(f"d{n}" for n in range(len(spans))),
        pixel_values=None,
        attention_mask=None,
        cacheable=cacheable,
    )


def test_image_keys_follow_the_image_and_never_meet_vocabulary_ids():
    a = vp.image_key("sig", "abc", 16)
    assert a == vp.image_key("sig", "abc", 16) and a >= vp.VIRTUAL_BASE
    assert len({a, vp.image_key("sig", "abd", 16), vp.image_key("sig", "abc", 17)}) == 3
    assert vp.image_key("other processor", "abc", 16) != a


def test_key_tokens_refuse_prefixes_ending_inside_an_image():
    prompt = _prompt([1, 2, 9, 9, 9, 9, 3, 4], [(2, 6)])
    assert prompt.key_tokens([1, 2]) == [1, 2]
    assert prompt.key_tokens([1, 2, 9]) is None  # inside the image
    full = prompt.key_tokens([1, 2, 9, 9, 9, 9, 3, 4, 77])
    assert full[:2] == [1, 2] and full[6:] == [3, 4, 77] and min(full[2:6]) >= vp.VIRTUAL_BASE
    assert prompt.key_tokens([1, 5]) is None  # not this prompt's tokens
    assert _prompt([1, 9, 2], [(1, 2)], cacheable=False).key_tokens([1, 9, 2]) is None
    assert prompt.images_in(0, 3) == [0] and prompt.images_in(6, 8) == []


def test_qwen_rope_delta_of_image_grids():
    # 64x64 -> 56x56 = grid (1, 4, 4), merge 2: 4 tokens over 2 positions (prototype: -2).
    assert vp.qwen_rope_delta(np.array([[1, 4, 4]]), 2) == -2
    assert vp.qwen_rope_delta(np.array([[1, 4, 4], [1, 4, 6]]), 2) == -2 + (3 - 6)


def test_hub_downloads_fetch_processor_files():
    from loading import hub

    patterns = hub._allow_patterns()
    for name in (
        "preprocessor_config.json",
        "processor_config.json",
        "chat_template.json",
        "chat_template.jinja",
        "model-00001-of-00002.safetensors",
    ):
        assert any(fnmatch.fnmatch(name, p) for p in patterns), name


# --------------------------------------------------------------------------- over gRPC
def test_images_to_a_text_only_model_are_refused():
    tok = toy_tokenizer()
    srv = InProcessServer(ScriptedModel(vocab_size(tok), tok.eos_token_id), tok)
    try:
        with pytest.raises(grpc.RpcError) as err:
            srv.stub.Predict(greedy("look", 4, Images=[b64(png())]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "serves text only" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            srv.stub.Predict(greedy("look", 4, Images=["%%%"]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Images[0]" in err.value.details()
        assert srv.stub.ModelMetadata(pb.ModelOptions()).media_marker == ""
        assert srv.stub.Predict(greedy("look", 2)).tokens >= 1
    finally:
        srv.stop()


def _checkpoint(path, names: list[str], **config) -> None:
    import json
    import struct

    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    header = {
        n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
        for i, n in enumerate(names)
    }
    blob = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(
        struct.pack("<Q", len(blob)) + blob + b"\0" * 4 * len(names)
    )


def test_vision_models_are_told_by_config_and_weights(tmp_path):
    from loading import vision

    vl = {"model_type": "qwen2_vl", "vision_config": {"depth": 2}}
    _checkpoint(tmp_path / "vl", ["vision_tower.blocks.0.w", "language_model.w"], **vl)
    assert vision.vision_config(tmp_path / "vl") is not None
    # Converted text-only (the config kept, the tower dropped): mlx-lm loads it, as before.
    _checkpoint(tmp_path / "text", ["model.layers.0.w", "lm_head.weight"], **vl)
    assert vision.vision_config(tmp_path / "text") is None
    _checkpoint(tmp_path / "llama", ["model.layers.0.w"], model_type="llama")
    assert vision.vision_config(tmp_path / "llama") is None
