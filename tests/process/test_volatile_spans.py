"""Claude Code's prompts through a real backend process over gRPC (the embedded SmolLM2):
the billing header whose nonce changes every request is removed before tokenizing
(option volatile_spans, default), so the next turn reuses the cached system prompt; with
the option off it does not, and the miss counter says why.

The prompt is what LocalAI's Anthropic endpoint makes of a Claude Code request: the system
blocks joined with nothing between them (core/schema/anthropic.go), the first being
``x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=<nonce>;``
(anthropics/claude-code issue #68900), then Messages rendered by the model's chat template.
"""

from __future__ import annotations

import json

import backend_pb2
from clients.server_process import ServerProcess
from loading import model_loader

GGUF = str(model_loader.embedded_model_path())
HEADER = "x-anthropic-billing-header: cc_version=2.1.177.{}; cc_entrypoint=cli; cch={};"
# A long constant system prompt (~200 tokens), as an agent's instructions and tools are.
SYSTEM = (
    "You are Claude Code, Anthropic's official CLI for Claude."
    + (
        " You help users with software engineering tasks: read the files you are pointed to,"
        " run the tests, keep every change small, and explain what you changed and why."
    )
    * 6
)
TURN_END = "<|im_end|>\n<|im_start|>assistant\n"  # SmolLM2's ChatML after a user turn


def start(*options: str) -> ServerProcess:
    srv = ServerProcess(
        env={"LOCALAI_MLX_METRICS_ADDR": "127.0.0.1:0", "LOCALAI_LOG_LEVEL": "debug"}
    )
    res = srv.stub.LoadModel(
        backend_pb2.ModelOptions(Model=GGUF, Options=list(options)), timeout=300
    )
    assert res.success, res.message
    return srv


def messages(question: str, header: str = "") -> list[backend_pb2.Message]:
    return [
        backend_pb2.Message(role="system", content=header + SYSTEM),
        backend_pb2.Message(role="user", content=question),
    ]


def ask(srv: ServerProcess, question: str, header: str = "") -> tuple[str, int, int, dict]:
    """(text, prompt tokens, prompt tokens prefilled, miss reasons) of a greedy reply."""
    reply = srv.stub.Predict(
        backend_pb2.PredictOptions(
            Messages=messages(question, header),
            UseTokenizerTemplate=True,
            Tokens=8,
            Temperature=0.0,
        ),
        timeout=300,
    )
    got = srv.stub.GetMetrics(backend_pb2.MetricsRequest())
    reasons = json.loads(got.prompt_json_for_slot)["metrics"]["prompt_cache_miss_reasons"]
    return reply.message.decode(), reply.prompt_tokens, got.prompt_tokens_processed, reasons


def tokens(srv: ServerProcess, text: str) -> int:
    return srv.stub.TokenizeString(backend_pb2.PredictOptions(Prompt=text)).length


def test_claude_codes_nonce_no_longer_ends_the_cached_prefix():
    first, second = "Who reviews the change?", "What do the tests check?"
    srv = start()
    try:
        text, n, prefilled, reasons = ask(srv, first, HEADER.format("a1b", "36ee5"))
        assert prefilled == n and reasons["cold"] == 1
        # The next turn, a new nonce: everything before the new user turn is reused.
        text, n, prefilled, reasons = ask(srv, second, HEADER.format("c2d", "0aaa9"))
        assert prefilled == tokens(srv, second + TURN_END) and prefilled < n // 4
        assert reasons == {"cold": 1, "diverged": 0, "evicted": 0, "untrimmable": 0}
        # The model answered the prompt without the header: the same prompt sent without
        # it is an exact repeat (one token prefilled) with the same greedy answer.
        plain, n_plain, prefilled, _ = ask(srv, second)
        assert (plain, n_plain, prefilled) == (text, n, 1)
        log = srv.logs()
        assert "parts at token" in log and "miss: cold" in log
    finally:
        srv.stop()

    srv = start("volatile_spans:none")
    try:
        ask(srv, first, HEADER.format("a1b", "36ee5"))
        _, n_kept, prefilled, reasons = ask(srv, second, HEADER.format("c2d", "0aaa9"))
        # The prompts part at the version suffix: only the tokens before it are reused.
        assert n_kept > n and prefilled > n_kept - 40
        assert reasons == {"cold": 1, "diverged": 1, "evicted": 0, "untrimmable": 0}
        # The debug line shows where: right after "cc_version=2.1.177.", both texts.
        line = next(x for x in srv.logs().splitlines() if "miss: diverged" in x)
        assert "then 'c2d" in line and "(stored: 'a1b" in line
        # Without a header at all the answer is the one the first server gave.
        assert ask(srv, second)[0] == text
    finally:
        srv.stop()
