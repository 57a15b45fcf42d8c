"""Vision-language models over real gRPC: images (base64 PNGs made here) to tiny random
mlx-vlm models (tests/vision_models.py), every answer compared with mlx-vlm's own greedy
generation (``mlx_vlm.stream_generate``), alone, batched with text and with each other,
through the prompt cache and its checkpoints; bad images refused without harming a
stream in flight."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
from pathlib import Path

import grpc
import pytest
import vision_models as vm
from helpers import greedy, status, wait_until
from inprocess import InProcessServer

import backend_pb2


@pytest.fixture(scope="module", autouse=True)
def offline():
    """mlx-vlm's fallbacks must never download; set for this module's tests only (the
    environment of the other tests stays as it was)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))
        yield


TOKENS = 12
MARKER = "<__media__>"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


GRADIENT, NOISE = vm.png(), vm.png(seed=7)
WIDE = vm.png((96, 64))


class Vision:
    """A served tiny vision model and mlx-vlm's own copy of it (the oracle)."""

    def __init__(self, kind: str, root: Path, options: list[str]) -> None:
        import mlx_vlm

        self.kind = kind
        self.path = vm.build(kind, root / kind)
        self.srv = InProcessServer()
        result = self.srv.stub.LoadModel(
            backend_pb2.ModelOptions(Model=str(self.path), Options=options)
        )
        assert result.success, result.message
        self.stub = self.srv.stub
        self.model, self.processor = mlx_vlm.load(str(self.path))

    def chat(self, messages: list, images: list[bytes]) -> str:
        from mlx_vlm.prompt_utils import apply_chat_template

        return apply_chat_template(
            self.processor, self.model.config, messages, num_images=len(images)
        )

    def expected(self, prompt: str, images: list[bytes], tokens: int = TOKENS) -> str:
        """mlx-vlm's greedy text for the templated ``prompt`` and ``images``."""
        import io

        from PIL import Image

        pictures = [Image.open(io.BytesIO(i)).convert("RGB") for i in images]
        ids = vm.reference(self.model, self.processor, prompt, pictures, tokens)
        return self.processor.tokenizer.decode(ids)

    def prompt_ids(self, prompt: str, images: list[bytes]) -> list[int]:
        """The processor's token ids for ``prompt`` and ``images`` (mlx-vlm's own path)."""
        import io

        from mlx_vlm.utils import prepare_inputs
        from PIL import Image

        pictures = [Image.open(io.BytesIO(i)).convert("RGB") for i in images]
        out = prepare_inputs(self.processor, images=pictures, prompts=prompt)
        return out["input_ids"].reshape(-1).tolist()

    def processed(self) -> int:
        """Prompt tokens the last request prefilled (not served by the prompt cache)."""
        return self.stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_tokens_processed

    @property
    def parts(self):
        return self.srv.engine.loaded.vision


@pytest.fixture(scope="module", params=vm.KINDS)
def vlm(request, tmp_path_factory):
    # Bounds: 4 images a request, 6200 pixels an image (96x64 passes, 80x80 does not).
    options = ["max_images:4", "max_image_pixels:6200", "warmup:false"]
    served = Vision(request.param, tmp_path_factory.mktemp("vlm"), options)
    try:
        yield served
    finally:
        served.srv.stop()


def ask(stub, prompt: str, images: list[bytes], tokens: int = TOKENS, **fields) -> str:
    req = greedy(prompt, tokens, Images=[b64(i) for i in images], **fields)
    return stub.Predict(req, timeout=120).message.decode()


def test_metadata_reports_the_media_marker(vlm):
    assert vlm.stub.ModelMetadata(backend_pb2.ModelOptions()).media_marker == MARKER


def test_image_requests_equal_mlx_vlm(vlm):
    # A raw prompt without markers is one user message, as LocalAI's mlx-vlm backend does.
    want = vlm.expected(
        vlm.chat([{"role": "user", "content": "Describe."}], [GRADIENT]), [GRADIENT]
    )
    assert ask(vlm.stub, "Describe.", [GRADIENT]) == want
    # Messages (UseTokenizerTemplate): the image goes to the last user message.
    req = backend_pb2.PredictOptions(
        UseTokenizerTemplate=True, Tokens=TOKENS, Temperature=0.0, Images=[b64(GRADIENT)]
    )
    req.Messages.add(role="user", content="Describe.")
    assert vlm.stub.Predict(req).message.decode() == want
    # A raw prompt with a marker: the marker is the image.
    raw = vlm.chat([{"role": "user", "content": "Describe."}], [GRADIENT])
    placeholder = vlm.parts.family.placeholder
    assert placeholder in raw
    reply = vlm.stub.Predict(
        greedy(raw.replace(placeholder, MARKER), TOKENS, Images=[b64(GRADIENT)])
    )
    assert reply.message.decode() == want
    # prompt_tokens counts the image's tokens, as the processor expands them.
    assert reply.prompt_tokens == len(vlm.prompt_ids(raw, [GRADIENT]))
    assert reply.prompt_tokens > len(vlm.processor.tokenizer.encode(raw))


def test_two_images_differ_and_each_equals_mlx_vlm(vlm):
    prompt = vlm.chat([{"role": "user", "content": "What is this?"}], [NOISE])
    a = ask(vlm.stub, "What is this?", [GRADIENT])
    b = ask(vlm.stub, "What is this?", [NOISE])
    assert a != b
    assert b == vlm.expected(prompt, [NOISE])


def test_two_images_in_one_prompt(vlm):
    # Raw prompt: each marker is one image, in order (here of different sizes).
    text = f"Compare {MARKER} with {MARKER} please."
    raw = text.replace(MARKER, vlm.parts.family.placeholder)
    assert ask(vlm.stub, text, [GRADIENT, WIDE]) == vlm.expected(raw, [GRADIENT, WIDE])
    # Markers inside a user message place its images where they are.
    req = backend_pb2.PredictOptions(
        UseTokenizerTemplate=True,
        Tokens=TOKENS,
        Temperature=0.0,
        Images=[b64(GRADIENT), b64(WIDE)],
    )
    req.Messages.add(role="user", content=f"{MARKER}Compare it with {MARKER}")
    parts = [
        {"type": "image"},
        {"type": "text", "text": "Compare it with "},
        {"type": "image"},
    ]
    want = vlm.expected(
        vlm.chat([{"role": "user", "content": parts}], [GRADIENT, WIDE]), [GRADIENT, WIDE]
    )
    assert vlm.stub.Predict(req).message.decode() == want


def test_text_only_request_to_a_vision_model(vlm):
    prompt = "Once upon a time, in a quiet village,"
    want = vlm.expected(prompt, [])
    assert vlm.stub.Predict(greedy(prompt, TOKENS)).message.decode() == want


def test_batch_of_image_and_text_requests_equals_solo(vlm):
    # Solo answers first, read-only for the prompt cache: the batched requests below then
    # prefill from their embeddings beside the running rows, not from the cache.
    text_prompt = "The history of the city begins with"
    short_prompt = "Rain"
    ro = {"PromptCacheRO": True}
    solo_text = vlm.stub.Predict(greedy(text_prompt, 40, **ro)).message.decode()
    solo_short = vlm.stub.Predict(greedy(short_prompt, TOKENS, **ro)).message.decode()
    cases = [
        ("Batch: describe.", [GRADIENT]),
        ("Batch: tell me about it.", [NOISE]),
        (f"Batch: compare {MARKER} and {MARKER}.", [WIDE, NOISE]),
    ]
    solo = [ask(vlm.stub, p, imgs, PromptCacheRO=True) for p, imgs in cases]
    results: dict[int, str] = {}
    started = threading.Event()

    def stream() -> None:
        chunks = []
        for r in vlm.stub.PredictStream(greedy(text_prompt, 40)):
            chunks.append(r.message.decode())
            started.set()
        results[-1] = "".join(chunks)

    def image(i: int) -> None:
        results[i] = ask(vlm.stub, *cases[i])

    def short() -> None:
        results[-2] = vlm.stub.Predict(greedy(short_prompt, TOKENS)).message.decode()

    threads = [threading.Thread(target=stream)]
    threads[0].start()
    started.wait(60)  # the text row decodes; the others join it at different times
    for target, args in [(image, (0,)), (short, ()), (image, (1,)), (image, (2,))]:
        t = threading.Thread(target=target, args=args)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(120)
    assert results[-1] == solo_text
    assert results[-2] == solo_short
    assert [results[i] for i in range(len(cases))] == solo


def test_same_image_new_text_reuses_the_prefix_and_other_image_does_not(vlm):
    first = f"{MARKER}Describe the picture in detail."
    ask(vlm.stub, first, [NOISE], tokens=4)
    follow = f"{MARKER}What colours are in it?"
    raw = follow.replace(MARKER, vlm.parts.family.placeholder)
    want = vlm.expected(raw, [NOISE])
    hits = vlm.parts.feature_hits
    reply = vlm.stub.Predict(greedy(follow, TOKENS, Images=[b64(NOISE)]))
    assert reply.message.decode() == want
    # The image's tokens came from the prompt cache: only the new text was prefilled.
    ids = vlm.prompt_ids(raw, [NOISE])
    image = [i for i, t in enumerate(ids) if t == vlm.parts.image_token_id]
    assert reply.prompt_tokens == len(ids)
    assert vlm.processed() <= len(ids) - (image[-1] + 1)
    assert vlm.parts.feature_hits == hits  # nothing to run through the tower at all
    # The same text with another image: the image is not reused, and the answer is its own.
    other = vlm.stub.Predict(greedy(follow, TOKENS, Images=[b64(GRADIENT)]))
    assert other.message.decode() == vlm.expected(raw, [GRADIENT])
    assert vlm.processed() >= len(ids) - image[0]
    # An exact repeat is a hit of all but one token, with the same answer.
    again = vlm.stub.Predict(greedy(follow, TOKENS, Images=[b64(GRADIENT)]))
    assert again.message.decode() == other.message.decode()
    assert vlm.processed() == 1


def test_vision_features_are_cached_by_image(vlm):
    ask(vlm.stub, f"Tell a story about {MARKER}", [WIDE], tokens=2)
    hits = vlm.parts.feature_hits
    ask(vlm.stub, f"Name the colours of {MARKER}", [WIDE], tokens=2)
    assert vlm.parts.feature_hits == hits + 1


def test_bad_images_are_refused_without_harming_a_stream(vlm):
    text_prompt = "A long story about a lighthouse keeper:"
    solo_text = vlm.stub.Predict(greedy(text_prompt, 48)).message.decode()
    out: list[str] = []
    started = threading.Event()

    def stream() -> None:
        for r in vlm.stub.PredictStream(greedy(text_prompt, 48)):
            out.append(r.message.decode())
            started.set()

    t = threading.Thread(target=stream)
    t.start()
    started.wait(60)

    def refused(req) -> str:
        try:
            vlm.stub.Predict(req)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
            return err.details()
        raise AssertionError("accepted")

    assert "Images[1]" in refused(greedy("x", 4, Images=[b64(GRADIENT), "not base64!"]))
    assert "Images[0]" in refused(greedy("x", 4, Images=[b64(b"\x89PNG\r\n\x1a\nbroken")]))
    assert "Images[0]" in refused(greedy("x", 4, Images=[b64(b"GIF89a....")]))
    assert "URL" in refused(greedy("x", 4, Images=["https://example.com/cat.png"]))
    assert "media markers" in refused(greedy(f"{MARKER} and {MARKER}", 4, Images=[b64(GRADIENT)]))
    assert "max_images" in refused(greedy("x", 4, Images=[b64(GRADIENT)] * 5))
    assert "max_image_pixels" in refused(greedy("x", 4, Images=[b64(vm.png((80, 80)))]))
    literal = vlm.parts.family.literals[0]
    assert "image token" in refused(greedy(f"see {literal}", 4, Images=[b64(GRADIENT)]))
    refused(greedy("x", 4, Videos=[b64(GRADIENT)]))
    # A data URL is fine.
    data_url = "data:image/png;base64," + b64(GRADIENT)
    assert (
        ask(vlm.stub, "Describe.", [GRADIENT])
        == vlm.stub.Predict(greedy("Describe.", TOKENS, Images=[data_url])).message.decode()
    )
    t.join(120)
    assert "".join(out) == solo_text


def test_disk_tier_after_a_restart_and_vision_off(tmp_path):
    srv = InProcessServer()
    try:
        path = vm.build("qwen2_vl", tmp_path / "q")

        def load(*options: str) -> None:
            model = backend_pb2.ModelOptions(Model=str(path), Options=list(options))
            assert srv.stub.LoadModel(model).success

        def processed() -> int:
            return srv.stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_tokens_processed

        disk = f"prompt_cache_dir:{tmp_path / 'prompt-cache'}"
        load(disk, "warmup:false")
        req = greedy(f"{MARKER}Describe it.", TOKENS, Images=[b64(NOISE)])
        first = srv.stub.Predict(req)
        assert wait_until(lambda: status(srv.stub).get("prompt_cache_disk_entries", 0), 30)
        srv.stub.Free(backend_pb2.HealthMessage())
        load(disk, "warmup:false")  # a new memory tier: only the disk holds the image prompt
        assert srv.stub.Predict(req).message == first.message
        assert processed() == 1
        # The same text with another image: the disk entry does not serve its image.
        other = srv.stub.Predict(greedy(f"{MARKER}Describe it.", TOKENS, Images=[b64(GRADIENT)]))
        assert processed() >= other.prompt_tokens - 1
        # vision:false serves the model text-only through mlx-lm, and says so to images.
        load("vision:false", "warmup:false")
        assert srv.stub.ModelMetadata(backend_pb2.ModelOptions()).media_marker == ""
        try:
            srv.stub.Predict(greedy("x", 4, Images=[b64(GRADIENT)]))
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "vision:false" in e.details()
        else:
            raise AssertionError("accepted")
        assert srv.stub.Predict(greedy("Hello", 3)).tokens == 3
    finally:
        srv.stop()


def test_a_failing_vision_tower_fails_that_request_alone(vlm, monkeypatch):
    import engine.vision

    text_prompt = "Once there was a small boat that"
    solo_text = vlm.stub.Predict(greedy(text_prompt, 32)).message.decode()
    real = engine.vision._tower

    def tower(parts, vision, i):
        if vision.digests[i] == bad_digest:
            raise RuntimeError("simulated tower fault")
        return real(parts, vision, i)

    bad = vm.png(seed=99)
    bad_digest = hashlib.sha256(bad).hexdigest()
    monkeypatch.setattr(engine.vision, "_tower", tower)
    out: list[str] = []
    started = threading.Event()

    def stream() -> None:
        for r in vlm.stub.PredictStream(greedy(text_prompt, 32)):
            out.append(r.message.decode())
            started.set()

    t = threading.Thread(target=stream)
    t.start()
    started.wait(60)
    try:
        vlm.stub.Predict(greedy(f"{MARKER} what?", 4, Images=[b64(bad)]))
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.INTERNAL
        assert "vision tower failed" in err.details()
    else:
        raise AssertionError("accepted")
    t.join(120)
    assert "".join(out) == solo_text
    assert ask(vlm.stub, f"{MARKER} what?", [GRADIENT], tokens=2)  # serving on


def test_image_requests_have_their_own_sampler_logprobs_and_stops(vlm):
    prompt = f"{MARKER}Write about it."
    want = ask(vlm.stub, prompt, [WIDE])
    # A stop string in the middle of the greedy answer cuts it there, never streamed.
    cut = len(want) // 2
    stop = want[cut : cut + 3]
    first = want.find(stop)
    reply = vlm.stub.Predict(greedy(prompt, TOKENS, Images=[b64(WIDE)], StopPrompts=[stop]))
    assert reply.message.decode() == want[:first]
    # Seeded sampling is reproducible beside whatever else runs; logprobs are reported.
    sampled = [
        vlm.stub.Predict(
            greedy(prompt, TOKENS, Images=[b64(WIDE)], Temperature=0.9, Seed=11, Logprobs=1)
        )
        for _ in range(2)
    ]
    assert sampled[0].message == sampled[1].message
    content = json.loads(sampled[0].logprobs)["content"]
    assert len(content) == sampled[0].tokens


# --------------------------------------------------------------------------- videos
# Ten 64x64 frames at 10 fps (1 s): mlx-vlm's sampling takes 4 of them (2 fps, raised to
# min_frames 4): frames 0, 3, 6, 9. APNG is lossless, so the decoded frames are these.
CLIP_FRAMES = [vm.image((64, 64), seed=s) for s in range(1, 11)]
CLIP = vm.animation(CLIP_FRAMES, duration_ms=100)
OTHER_CLIP = vm.animation(CLIP_FRAMES[::-1], duration_ms=100)


def video_expected(vlm: Vision, prompt: str, frames, tokens: int = TOKENS) -> str:
    """mlx-vlm's greedy text for the templated ``prompt`` and one video: ``frames``
    (decoded frames, as mlx-vlm's ``prepare_inputs`` takes them) or a video file's path
    (mlx-vlm then samples and decodes it itself, ``mlx_vlm.utils.load_video``)."""
    import numpy as np

    clip = frames if isinstance(frames, str) else np.stack([np.asarray(f) for f in frames])
    ids = vm.reference(vlm.model, vlm.processor, prompt, [], tokens, videos=[clip])
    return vlm.processor.tokenizer.decode(ids)


def mp4(path: Path, frames: list, fps: float = 10.0) -> bytes:
    """``frames`` written as an MP4 file at ``path`` (OpenCV, mlx-vlm's video library)."""
    import cv2
    import numpy as np

    size = frames[0].size
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
    assert writer.isOpened()
    for frame in frames:
        writer.write(np.asarray(frame)[:, :, ::-1])  # OpenCV writes BGR
    writer.release()
    return path.read_bytes()


def test_video_requests_equal_mlx_vlm_or_are_refused(vlm):
    def call(req):
        return vlm.stub.Predict(req, timeout=120)

    if vlm.kind != "qwen2_vl":  # Gemma 3: mlx-vlm's model embeds no video
        with pytest.raises(grpc.RpcError) as err:
            call(greedy("Describe.", 4, Videos=[b64(CLIP)]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "takes no videos" in err.value.details()
        return
    from mlx_vlm.prompt_utils import apply_chat_template

    # mlx-vlm's own prompt for a video: the video before the text of the user message.
    prompt = apply_chat_template(vlm.processor, vlm.model.config, "Describe.", video=["clip"])
    assert vlm.parts.family.video_placeholder in prompt
    sampled = [CLIP_FRAMES[i] for i in (0, 3, 6, 9)]
    want = video_expected(vlm, prompt, sampled)
    assert want != video_expected(vlm, prompt, CLIP_FRAMES[:4])  # the frames matter
    # A raw prompt without markers: one user message, as mlx-vlm renders it.
    reply = call(greedy("Describe.", TOKENS, Videos=[b64(CLIP)]))
    assert reply.message.decode() == want
    # prompt_tokens counts the video's tokens: 4 frames of 56x56 = 2 x 4 x 4 patches / 4.
    assert reply.prompt_tokens == len(vlm.processor.tokenizer.encode(prompt)) - 1 + 8
    # Messages (UseTokenizerTemplate, as LocalAI sends them): the same prompt.
    req = backend_pb2.PredictOptions(
        UseTokenizerTemplate=True, Tokens=TOKENS, Temperature=0.0, Videos=[b64(CLIP)]
    )
    req.Messages.add(role="user", content="Describe.")
    assert call(req).message.decode() == want
    streamed = "".join(r.message.decode() for r in vlm.stub.PredictStream(req, timeout=120))
    assert streamed == want
    # LocalAI's [vid-N] marker in a prompt it rendered itself is the video.
    raw = prompt.replace(vlm.parts.family.video_placeholder, "[vid-0]")
    assert call(greedy(raw, TOKENS, Videos=[b64(CLIP)])).message.decode() == want
    # Another clip, another answer (nothing is cached across videos).
    other = [CLIP_FRAMES[::-1][i] for i in (0, 3, 6, 9)]
    got = call(greedy("Describe.", TOKENS, Videos=[b64(OTHER_CLIP)])).message.decode()
    assert got == video_expected(vlm, prompt, other) and got != want


def test_an_mp4_equals_mlx_vlm_reading_the_same_file(vlm, tmp_path):
    """A video file goes through mlx-vlm's own reader (OpenCV), sampled as mlx-vlm samples
    it: the answer equals mlx-vlm's generation given the file's path."""
    if vlm.kind != "qwen2_vl":
        pytest.skip("videos go to Qwen2-VL only (Gemma 3's refusal: the test above)")
    from mlx_vlm.prompt_utils import apply_chat_template

    # 30 frames at 10 fps: 3 s, so 6 frames at mlx-vlm's 2 fps.
    path = tmp_path / "clip.mp4"
    data = mp4(path, [vm.image((64, 64), seed=s) for s in range(1, 31)])
    prompt = apply_chat_template(vlm.processor, vlm.model.config, "Describe.", video=["clip"])
    want = video_expected(vlm, prompt, str(path))
    reply = vlm.stub.Predict(greedy("Describe.", TOKENS, Videos=[b64(data)]), timeout=120)
    assert reply.message.decode() == want
    # 6 frames of 56x56: 3 x 4 x 4 patches, merged 2x2: 12 video tokens.
    assert reply.prompt_tokens == len(vlm.processor.tokenizer.encode(prompt)) - 1 + 12


@pytest.mark.parametrize(("frames", "fps"), [(7, 10.0), (30, 10.0), (95, 25.0), (200, 4.0)])
def test_animation_sampling_is_mlx_vlms_on_a_file(vlm, tmp_path, frames, fps):
    """`parsing.videos.frame_indices` (the rule for PIL's animations, written from mlx-vlm's
    reader) picks the frames mlx-vlm's ``load_video`` picks from a file of that length."""
    if vlm.kind != "qwen2_vl":
        pytest.skip("videos go to Qwen2-VL only (Gemma 3's refusal: the test above)")
    from mlx_vlm.utils import VideoSampling, load_video

    from parsing.videos import frame_indices

    path = tmp_path / "clip.mp4"
    mp4(path, [vm.image((16, 16), seed=s + 1) for s in range(frames)], fps)
    sampling = vlm.parts.video_sampling
    how = VideoSampling(
        fps=sampling.fps,
        min_frames=sampling.min_frames,
        max_frames=sampling.max_frames,
        frame_factor=sampling.frame_factor,
    )
    _, metadata = load_video(str(path), how)
    assert metadata.frames_indices == frame_indices(frames, frames / fps, sampling)


def test_bad_videos_are_refused_naming_them(vlm, tmp_path):
    if vlm.kind != "qwen2_vl":
        pytest.skip("videos go to Qwen2-VL only (Gemma 3's refusal: the test above)")

    def refused(req) -> str:
        with pytest.raises(grpc.RpcError) as err:
            vlm.stub.Predict(req, timeout=120)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        return err.value.details()

    clip = b64(CLIP)
    assert "Images and PredictOptions.Videos in one request" in refused(
        greedy("x", 4, Videos=[clip], Images=[b64(GRADIENT)])
    )
    assert "2 video markers" in refused(greedy("[vid-0] [vid-1] x", 4, Videos=[clip]))
    assert "media marker" in refused(greedy(f"{MARKER} x", 4, Videos=[clip]))
    assert "Videos[0] has one frame" in refused(greedy("x", 4, Videos=[b64(GRADIENT)]))
    assert "Videos[0] cannot be decoded as a video file (MP4)" in refused(
        greedy("x", 4, Videos=[b64(b"\0\0\0\x18ftypisom" + b"\0" * 32)])
    )
    # 80x80 frames are over max_image_pixels (6200) of this fixture.
    big = vm.animation([vm.image((80, 80), seed=s) for s in (1, 2)])
    assert "max_image_pixels" in refused(greedy("x", 4, Videos=[b64(big)]))
    big = mp4(tmp_path / "big.mp4", [vm.image((80, 80), seed=s) for s in range(4)])
    assert "Videos[0] is 80x80 = 6400 pixels a frame" in refused(greedy("x", 4, Videos=[b64(big)]))
    # The server serves on.
    assert vlm.stub.Predict(greedy("Describe.", 2, Videos=[clip])).tokens >= 1
