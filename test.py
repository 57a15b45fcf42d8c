"""LocalAI-style smoke tests (``python -m unittest test.py``, what ``test.sh`` runs).

LocalAI runs each Python backend's ``test.py`` with ``libbackend.sh``'s ``runUnittests``.
These start ``backend.py`` as LocalAI's launcher does (``python backend.py --addr ...``),
on a free port, with the embedded SmolLM2-135M model (no download), and check the reply
texts LocalAI's Go code and its own mlx tests compare: Health's ``OK`` and LoadModel's
``MLX model loaded successfully``. The full suite is ``make test`` (pytest, ``tests/``).
"""

from __future__ import annotations

import concurrent.futures
import unittest
from typing import Any, ClassVar

import grpc

import backend_pb2
from clients.server_process import ServerProcess
from loading import model_loader

LOADED = "MLX model loaded successfully"  # LocalAI's backend/python/mlx/test.py compares it


class BackendTest(unittest.TestCase):
    """One ``backend.py`` process with the embedded model loaded, shared by the tests."""

    server: ClassVar[ServerProcess]
    stub: ClassVar[Any]  # backend_pb2_grpc.BackendStub (protoc writes no types)
    model_file: ClassVar[str]
    load_reply: ClassVar[backend_pb2.Result]

    @classmethod
    def setUpClass(cls) -> None:
        # `python backend.py --addr 127.0.0.1:0`, as LocalAI's launcher starts it.
        cls.server = ServerProcess(start_timeout=120.0)
        cls.stub = cls.server.stub
        cls.model_file = str(model_loader.embedded_model_path())
        cls.load_reply = cls.stub.LoadModel(
            backend_pb2.ModelOptions(Model="embedded", ModelFile=cls.model_file)
        )

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()
        cls.server.remove_log()

    def predict(self, prompt: str, **fields: Any) -> backend_pb2.Reply:
        return self.stub.Predict(
            backend_pb2.PredictOptions(Prompt=prompt, Temperature=0, **fields), timeout=300
        )

    def test_health_says_ok(self) -> None:
        self.assertEqual(self.stub.Health(backend_pb2.HealthMessage()).message, b"OK")

    def test_load_model_reply_text(self) -> None:
        self.assertTrue(self.load_reply.success, self.load_reply.message)
        self.assertEqual(self.load_reply.message, LOADED)

    def test_text(self) -> None:
        reply = self.predict("The capital of France is", Tokens=16)
        self.assertGreater(len(reply.message), 0)
        self.assertGreater(reply.tokens, 0)
        self.assertLessEqual(reply.tokens, 16)

    def test_sampling_params(self) -> None:
        reply = self.stub.Predict(
            backend_pb2.PredictOptions(
                Prompt="The capital of France is",
                TopP=0.8,
                Tokens=50,
                Temperature=0.7,
                TopK=40,
                PresencePenalty=0.1,
                FrequencyPenalty=0.2,
                MinP=0.05,
                Seed=42,
                StopPrompts=["\n"],
                IgnoreEOS=True,
            ),
            timeout=300,
        )
        self.assertNotIn(b"\n", reply.message)  # a matched stop string is never returned
        self.assertGreater(reply.tokens, 0)
        self.assertLessEqual(reply.tokens, 50)

    def test_concurrent_requests(self) -> None:
        prompts = [f"The capital of {c} is" for c in ("France", "Germany", "Italy", "Spain")]
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            replies = list(pool.map(lambda p: self.predict(p, Tokens=12), prompts))
        self.assertEqual(len(replies), len(prompts))
        for reply in replies:
            self.assertGreater(len(reply.message), 0)

    def test_cache_reuse_gives_the_same_text(self) -> None:
        prompt = "The quick brown fox jumps over the lazy dog. "
        first = self.predict(prompt, Tokens=10)
        second = self.predict(prompt, Tokens=10)
        self.assertEqual(second.message, first.message)
        self.assertEqual(second.prompt_tokens, first.prompt_tokens)

    def test_prefix_cache_reuse(self) -> None:
        base = "Once upon a time in a land far away, "
        first = self.predict(base, Tokens=10)
        longer = self.predict(base + "there lived a brave knight who ", Tokens=10)
        self.assertGreater(len(first.message), 0)
        self.assertGreater(longer.prompt_tokens, first.prompt_tokens)

    def test_tokenize_string(self) -> None:
        reply = self.stub.TokenizeString(backend_pb2.PredictOptions(Prompt="Hello, world"))
        self.assertGreater(reply.length, 0)
        self.assertEqual(len(reply.tokens), reply.length)

    def test_embedding(self) -> None:
        reply = self.stub.Embedding(backend_pb2.PredictOptions(Embeddings="A test sentence."))
        self.assertGreater(len(reply.embeddings), 0)
        self.assertTrue(all(isinstance(v, float) for v in reply.embeddings))

    def test_zz_free_then_load_again(self) -> None:  # runs last (unittest sorts by name)
        self.assertTrue(self.stub.Free(backend_pb2.HealthMessage()).success)
        with self.assertRaises(grpc.RpcError):
            self.predict("Hello", Tokens=4)
        again = self.stub.LoadModel(
            backend_pb2.ModelOptions(Model="embedded", ModelFile=self.model_file)
        )
        self.assertTrue(again.success, again.message)
        self.assertEqual(again.message, LOADED)


if __name__ == "__main__":
    unittest.main()
