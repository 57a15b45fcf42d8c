"""``PredictOptions.Videos`` without a model: base64 and bounds (`parsing.videos.read_videos`),
frames sampled by mlx-vlm's rule (``mlx_vlm.utils.load_video``: 2 fps, 4 to max frames, an
even count, ``linspace(0, T - 1, n).round()``), decoded from animated PNG / WebP / GIF, and
over real gRPC the refusal of videos sent to a text-only model. The vision path itself
(Qwen2-VL, its output equal to mlx-vlm's) is in tests/model/test_vision.py."""

from __future__ import annotations

import base64

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
from parsing import images, videos
from parsing.videos import FrameSampling, frame_indices
from seam.tokenizer import vocab_size

# mlx-vlm's sampling for Qwen-style processors (fps 2, min 4 frames, pairs), max 32 here.
SAMPLING = FrameSampling(fps=2.0, min_frames=4, max_frames=32, frame_factor=2)


def frames(n: int, size: tuple[int, int] = (16, 12)) -> list[Image.Image]:
    rng = np.random.default_rng(n)
    return [
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3)).astype(np.uint8), "RGB")
        for _ in range(n)
    ]


def animation(pictures: list[Image.Image], fmt: str = "PNG", duration_ms: int = 100) -> bytes:
    import io

    buf = io.BytesIO()
    extra = {"lossless": True} if fmt == "WEBP" else {}
    pictures[0].save(
        buf, format=fmt, save_all=True, append_images=pictures[1:], duration=duration_ms, **extra
    )
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# --------------------------------------------------------------------------- sampling
@pytest.mark.parametrize(
    ("total", "seconds", "expected"),
    [
        # 1 s: 2 frames at 2 fps, raised to min_frames 4, spread over the clip.
        (10, 1.0, [0, 3, 6, 9]),
        # 10 s at 10 fps: 20 frames.
        (100, 10.0, np.linspace(0, 99, 20).round().astype(int).tolist()),
        # 100 s: 200 frames wanted, max_frames 32.
        (1000, 100.0, np.linspace(0, 999, 32).round().astype(int).tolist()),
        # 3 frames: at most min(max_frames, 3) rounded down to pairs.
        (3, 0.3, [0, 2]),
        # 9 frames over 3 s: 6 frames (an even count).
        (9, 3.0, [0, 2, 3, 5, 6, 8]),
        # No durations: 1 fps (mlx-vlm's fallback), so 2 frames a frame, capped at the clip.
        (6, 0.0, [0, 1, 2, 3, 4, 5]),
    ],
)
def test_frames_are_taken_as_mlx_vlm_takes_them(total, seconds, expected):
    assert frame_indices(total, seconds, SAMPLING) == expected


def test_max_frames_is_the_cap_and_too_short_a_clip_is_refused():
    assert len(frame_indices(1000, 100.0, FrameSampling(max_frames=8))) == 8
    with pytest.raises(ValueError, match="it has 1 frames; at least 2 are needed"):
        frame_indices(1, 1.0, SAMPLING)


# --------------------------------------------------------------------------- reading
@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "GIF"])
def test_animations_are_read_and_hashed(fmt):
    data = animation(frames(4), fmt)
    (video,) = videos.read_videos([b64(data)])
    assert (video.index, video.format, video.data) == (0, fmt, data)
    assert len(video.digest) == 64 and "bytes" in repr(video) and str(data[:4]) not in repr(video)


CONTAINERS = [
    (b"\x00\x00\x00\x18ftypmp42" + b"\0" * 16, "MP4"),
    (b"\x1a\x45\xdf\xa3" + b"\0" * 16, "MATROSKA"),
    (b"RIFF\0\0\0\0AVI LIST" + b"\0" * 16, "AVI"),
]


@pytest.mark.parametrize(("data", "fmt"), CONTAINERS)
def test_video_files_are_read_for_opencv_or_refused_without_it(data, fmt, monkeypatch):
    # OpenCV is in requirements-vision.txt: a video file is read (decoded by mlx-vlm's
    # load_video on the prompt workers, tests/model/test_vision.py).
    assert videos.has_decoder()
    (video,) = videos.read_videos([b64(data)])
    assert video.format == fmt and video.data == data
    monkeypatch.setattr(videos, "has_decoder", lambda: False)
    with pytest.raises(ValueError, match=r"PredictOptions\.Videos\[0\] is a video file") as err:
        videos.read_videos([b64(data)])
    assert "install opencv-python-headless" in str(err.value)
    assert "animated WebP, GIF or PNG" in str(err.value)


def test_other_files_are_refused_naming_the_entry():
    with pytest.raises(ValueError, match=r"PredictOptions\.Videos\[1\] is not an animated GIF"):
        videos.read_videos([b64(animation(frames(2))), b64(b"hello world")])


def test_count_and_bytes_are_bounded():
    clip = b64(animation(frames(2)))
    with pytest.raises(ValueError, match=r"3 videos, more than the 2 .*max_videos"):
        videos.read_videos([clip] * 3, max_videos=2)
    with pytest.raises(ValueError, match=r"Videos\[0\] is .*limit per video"):
        videos.read_videos([clip], max_bytes=10)
    with pytest.raises(ValueError, match=r"Videos\[0\] is a URL"):
        videos.read_videos(["https://example.com/a.mp4"])


def test_limits_come_from_load_options():
    load = params.load_params(
        pb.ModelOptions(Model="m", Options=["max_videos:1", "max_video_bytes:100"])
    )
    clip = b64(animation(frames(2)))
    req = pb.PredictOptions(Prompt="x", Videos=[clip])
    assert len(params.parse_request(req).prompt.videos) == 1  # a video is no refused field
    with pytest.raises(ValueError, match="max_videos"):
        params.parse_request(pb.PredictOptions(Prompt="x", Videos=[clip] * 2), load)
    big = b64(animation(frames(4, (64, 64))))
    with pytest.raises(ValueError, match="the limit per video"):
        params.parse_request(pb.PredictOptions(Prompt="x", Videos=[big]), load)
    assert (
        params.load_params(
            pb.ModelOptions(Model="m", Options=["max_video_frames:8"])
        ).vision.max_video_frames
        == 8
    )


# --------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_lossless_animations_decode_to_exactly_the_sampled_frames(fmt):
    source = frames(10)
    (video,) = videos.read_videos([b64(animation(source, fmt, duration_ms=100))])
    got = videos.decode_frames(video, SAMPLING)
    assert got.dtype == np.uint8 and got.shape == (4, 12, 16, 3)
    want = np.stack([np.asarray(source[i]) for i in (0, 3, 6, 9)])
    assert np.array_equal(got, want)


def test_durations_decide_the_count():
    # 10 frames of 500 ms: 5 s, so 10 frames at 2 fps (all of them).
    (video,) = videos.read_videos([b64(animation(frames(10), duration_ms=500))])
    assert len(videos.decode_frames(video, SAMPLING)) == 10


def test_gif_frames_decode_in_order():
    source = [Image.new("RGB", (8, 8), (40 * i, 255 - 40 * i, 0)) for i in range(6)]
    (video,) = videos.read_videos([b64(animation(source, "GIF", duration_ms=250))])
    got = videos.decode_frames(video, SAMPLING)  # 1.5 s: 3 frames, raised to 4
    assert got.shape[0] == 4
    reds = [int(f[0, 0, 0]) for f in got]
    assert reds == sorted(reds) and reds[0] == 0 and reds[-1] == 200


def test_a_still_image_and_oversized_frames_are_refused():
    (still,) = videos.read_videos([b64(animation(frames(1)))])
    with pytest.raises(ValueError, match=r"Videos\[0\] has one frame: send a still image"):
        videos.decode_frames(still, SAMPLING)
    (clip,) = videos.read_videos([b64(animation(frames(4, (40, 30))))])
    with pytest.raises(ValueError, match=r"40x30 = 1200 pixels a frame.*max_image_pixels"):
        videos.decode_frames(clip, SAMPLING, max_pixels=1000)
    with pytest.raises(ValueError, match=r"4 sampled frames of 40x30 hold 4800 pixels"):
        videos.decode_frames(clip, SAMPLING, budget=4799)
    assert len(videos.decode_frames(clip, SAMPLING, budget=4800)) == 4


def test_the_frames_of_a_file_are_bounded_before_decoding(monkeypatch):
    (clip,) = videos.read_videos([b64(animation(frames(4, (40, 30))))])
    monkeypatch.setattr(videos, "MAX_SOURCE_PIXELS", 4 * 1200 - 1)
    with pytest.raises(ValueError, match=r"4 frames of 40x30, more than a video may have"):
        videos.decode_frames(clip, SAMPLING)
    monkeypatch.setattr(videos, "MAX_SOURCE_PIXELS", 4 * 1200)
    monkeypatch.setattr(videos, "MAX_SOURCE_FRAMES", 3)
    with pytest.raises(ValueError, match=r"\(3 frames, 4800 pixels in all"):
        videos.decode_frames(clip, SAMPLING)


def test_a_corrupt_animation_is_refused_naming_it():
    data = animation(frames(6))
    (clip,) = videos.read_videos([b64(data[: len(data) // 2])])
    with pytest.raises(ValueError, match=r"Videos\[0\] cannot be decoded as an animated PNG"):
        videos.decode_frames(clip, SAMPLING)


def test_frames_share_the_image_decode_slots():
    assert videos.images_mod.DECODE_SLOTS is images._DECODING


# --------------------------------------------------------------------------- over gRPC
def test_videos_to_a_text_only_model_are_refused_over_grpc():
    tok = toy_tokenizer()
    srv = InProcessServer(ScriptedModel(vocab_size(tok), tok.eos_token_id), tok)
    try:
        clip = b64(animation(frames(4)))
        with pytest.raises(grpc.RpcError) as err:
            srv.stub.Predict(greedy("look", 4, Videos=[clip]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "PredictOptions.Videos: the loaded model" in err.value.details()
        assert "serves text only" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            srv.stub.PredictStream(greedy("look", 4, Videos=["%%%"])).next()
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Videos[0]" in err.value.details()
        assert srv.stub.Predict(greedy("look", 2)).tokens >= 1  # the server serves on
    finally:
        srv.stop()
