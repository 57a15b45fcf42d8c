"""What LocalAI's importer, loader and CLI really send (issue 25), without a model.

- Model names: LocalAI's MLX importer writes ``model: https://huggingface.co/OWNER/NAME``
  (core/gallery/importers/mlx.go, mlx_test.go), and ``huggingface://`` / ``hf://`` /
  ``hf.co/`` references with fewer than 3 path pieces pass LocalAI unchanged
  (pkg/downloader/uri.go ResolveURL): all are hub repos here, anything else a path.
- The Hugging Face cache: LocalAI sets HF_HOME, TRANSFORMERS_CACHE and
  HUGGINGFACE_HUB_CACHE to its models directory when unset (pkg/model/initializers.go,
  spawnGRPCModel); the cache is then where huggingface_hub itself puts it.
- TopK: LocalAI's family defaults send ``top_k: -1`` (core/config/inference_defaults.json,
  core/backend/options.go gRPCPredictOpts): off, not an error.
- Parser names: every name of LocalAI's core/config/parser_defaults.json maps to a parser;
  other names warn and keep mlx-lm's detection (toy tokenizer, scripted outputs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlx_lm.tool_parsers import json_tools, minimax_m2

import backend_pb2 as pb
import params
from decoding.output import OutputPipeline
from decoding.parsers import (
    HARMONY_FORMAT,
    TOOL_PARSERS,
    apply_parser_overrides,
    resolve_reasoning_markers,
    resolve_tool_parser,
)
from decoding.reasoning_formats import NO_FORMAT
from decoding.tool_calls import merge_tool_call_deltas
from loading import hub, model_loader
from loading.hub import HubId
from seam import tokenizer as seam_tokenizer

# --------------------------------------------------------------------------- model names


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (
            "mlx-community/Llama-3.2-1B-Instruct-4bit",
            HubId("mlx-community/Llama-3.2-1B-Instruct-4bit"),
        ),
        # What the importer writes (mlx_test.go asserts model: https://huggingface.co/...)
        ("https://huggingface.co/mlx-community/test-model", HubId("mlx-community/test-model")),
        ("https://huggingface.co/mlx-community/test-model/", HubId("mlx-community/test-model")),
        ("http://huggingface.co/o/r", HubId("o/r")),
        ("https://hf.co/o/r", HubId("o/r")),
        ("HTTPS://HuggingFace.co/o/r", HubId("o/r")),
        ("https://huggingface.co/o/r?library=mlx#files", HubId("o/r")),
        ("https://huggingface.co/o/r/tree/dev", HubId("o/r", revision="dev")),
        ("https://huggingface.co/o/r/tree/main", HubId("o/r")),
        ("https://huggingface.co/o/r/tree/refs%2Fpr%2F1/", HubId("o/r", revision="refs/pr/1")),
        ("https://huggingface.co/o/r/resolve/main/m.Q4_0.gguf", HubId("o/r", "m.Q4_0.gguf")),
        ("https://huggingface.co/o/r/blob/v1/q/m.gguf", HubId("o/r", "q/m.gguf", "v1")),
        ("hf.co/o/r", HubId("o/r")),
        ("huggingface://o/r", HubId("o/r")),
        ("huggingface://o/r@dev", HubId("o/r", revision="dev")),
        ("hf://o/r", HubId("o/r")),
        ("hf://o/r/", HubId("o/r")),
        ("hf://o/r@v2/m.gguf", HubId("o/r", "m.gguf", "v2")),
    ],
)
def test_hub_references_localai_writes_are_repos(model: str, expected: HubId) -> None:
    assert hub.parse_hub_id(model) == expected


@pytest.mark.parametrize(
    "model",
    [
        "/models/my-model",
        "my-model",
        "dir/sub/model",
        "o/r@dev",  # a revision only behind a scheme
        "file:///abs/dir",  # LocalAI strips file:// itself (helpers.go LocalModelPath)
        "https://example.com/o/r",
        "https://huggingface.co:8443/o/r",
        "https://huggingface.co/o",
        "https://huggingface.co/datasets/o/r",
        "https://huggingface.co/o/r/resolve/main/model.safetensors",
        "https://huggingface.co/o/r/discussions/1",
        "huggingface://o/r@",
        "ollama://llama3",
        "oci://registry/x",
    ],
)
def test_other_names_stay_paths(model: str) -> None:
    assert hub.parse_hub_id(model) is None


def test_importer_url_resolves_through_the_hub_cache(tmp_path: Path, monkeypatch) -> None:
    """As LocalAI loads it: ModelOptions.Model is the URL as written, ModelFile the models
    dir joined with it (pkg/model/loader.go filepath.Join: a path that does not exist),
    ModelPath the models dir (pkg/model/initializers.go)."""
    url = "https://huggingface.co/mlx-community/Llama-3.2-1B-Instruct-4bit"
    models = tmp_path / "models"
    snapshot = models / "models--mlx-community--Llama-3.2-1B-Instruct-4bit" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    asked: list[HubId] = []
    monkeypatch.setattr(hub, "cached", lambda hub_id: asked.append(hub_id) or snapshot)
    model_file = str(models / "https:" / "huggingface.co/mlx-community/Llama-3.2-1B-Instruct-4bit")
    resolved = model_loader.resolve_model(url, model_file, str(models))
    assert asked == [HubId("mlx-community/Llama-3.2-1B-Instruct-4bit")]
    assert (resolved.kind, resolved.path) == ("hf_cache", snapshot)


def test_a_name_that_is_neither_lists_the_hub_forms(tmp_path: Path) -> None:
    with pytest.raises(model_loader.ModelLoadError, match=r"https://huggingface.co/owner/name"):
        model_loader.resolve_model("https://example.com/a/b", "", str(tmp_path))


# --------------------------------------------------------------------------- the HF cache
_HF_VARS = (
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "TRANSFORMERS_CACHE",
    "XDG_CACHE_HOME",
)


@pytest.fixture
def clean_hf_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _HF_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _huggingface_hub_says(env: dict[str, str]) -> str:
    """huggingface_hub's own HF_HUB_CACHE for ``env``, from a fresh interpreter."""
    clean = {k: v for k, v in os.environ.items() if k not in _HF_VARS}
    code = "from huggingface_hub import constants; print(constants.HF_HUB_CACHE)"
    out = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True
    )
    return out.stdout.strip()


def test_localai_environment_puts_the_cache_in_the_models_dir(clean_hf_env, tmp_path) -> None:
    """LocalAI sets all three to the models dir (initializers.go): HUGGINGFACE_HUB_CACHE wins
    over HF_HOME, so repos live in <models>/models--owner--name, not <models>/hub."""
    models = str(tmp_path / "models")
    env = {"HF_HOME": models, "TRANSFORMERS_CACHE": models, "HUGGINGFACE_HUB_CACHE": models}
    for name, value in env.items():
        clean_hf_env.setenv(name, value)
    assert hub.settings().cache_dir == Path(models)
    assert _huggingface_hub_says(env) == models


@pytest.mark.parametrize(
    ("env", "relative"),
    [
        ({"HF_HOME": "home"}, "home/hub"),
        ({"HF_HOME": "home", "HUGGINGFACE_HUB_CACHE": "legacy"}, "legacy"),
        ({"HF_HOME": "home", "HUGGINGFACE_HUB_CACHE": "legacy", "HF_HUB_CACHE": "new"}, "new"),
        ({"XDG_CACHE_HOME": "xdg"}, "xdg/huggingface/hub"),
    ],
)
def test_cache_precedence_is_huggingface_hubs(clean_hf_env, tmp_path, env, relative) -> None:
    env = {k: str(tmp_path / v) for k, v in env.items()}
    for name, value in env.items():
        clean_hf_env.setenv(name, value)
    assert hub.settings().cache_dir == tmp_path / relative
    assert _huggingface_hub_says(env) == str(tmp_path / relative)


def test_offline_and_endpoint_follow_the_environment(clean_hf_env) -> None:
    clean_hf_env.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    clean_hf_env.setenv("HF_HUB_OFFLINE", "1")
    cfg = hub.settings()
    assert (cfg.endpoint, cfg.offline) == ("http://127.0.0.1:9", True)
    clean_hf_env.setenv("HF_HUB_OFFLINE", "0")
    assert not hub.settings().offline


@pytest.mark.parametrize(
    "env",
    [
        {"HF_ENDPOINT": "http://127.0.0.1:9/", "TRANSFORMERS_OFFLINE": "yes"},
        {"HF_HUB_OFFLINE": "On", "HF_HUB_CACHE": "~/hf-cache-$HF_TEST_SUFFIX"},
        {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"},
    ],
)
def test_endpoint_offline_and_cache_agree_with_a_fresh_huggingface_hub(clean_hf_env, env):
    """settings() reads the environment itself (huggingface_hub reads it once, at import):
    what it finds is what a huggingface_hub imported under that environment finds."""
    env = {**env, "HF_TEST_SUFFIX": "x"}
    for name in ("HF_ENDPOINT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        clean_hf_env.delenv(name, raising=False)
    for name, value in env.items():
        clean_hf_env.setenv(name, value)
    clean = {k: v for k, v in os.environ.items() if k not in _HF_VARS}
    code = (
        "from huggingface_hub import constants as c; "
        "print(c.ENDPOINT, c.HF_HUB_OFFLINE, c.HF_HUB_CACHE, sep='\\n')"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True
    )
    endpoint, offline, cache = out.stdout.splitlines()
    cfg = hub.settings()
    assert (cfg.endpoint, str(cfg.offline), str(cfg.cache_dir)) == (endpoint, offline, cache)


def test_the_environment_now_decides_not_the_one_at_import(monkeypatch, tmp_path) -> None:
    """huggingface_hub read its variables at import; a later change (LocalAI sets them before
    the backend starts, tests after) is still what decides, and going back reads the old."""
    before = hub.settings().cache_dir
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "now"))
    assert hub.settings().cache_dir == tmp_path / "now"
    monkeypatch.undo()
    assert hub.settings().cache_dir == before


# --------------------------------------------------------------------------- TopK
def test_negative_top_k_is_off() -> None:
    """LocalAI's family defaults send TopK -1 (inference_defaults.json: llama-3.x, phi-4,
    mistral, deepseek, ...): off, whatever the load option says."""
    assert params.generation_params(pb.PredictOptions(TopK=-1)).top_k == 0
    lp = params.load_params(pb.ModelOptions(Model="m", Options=["top_k:40"]))
    assert params.generation_params(pb.PredictOptions(TopK=-1), lp).top_k == 0
    assert params.generation_params(pb.PredictOptions(TopK=-(2**31)), lp).top_k == 0
    assert params.generation_params(pb.PredictOptions(TopK=0), lp).top_k == 40  # not set
    assert params.generation_params(pb.PredictOptions(TopK=5), lp).top_k == 5


# --------------------------------------------------------------------------- parser names
# LocalAI's core/config/parser_defaults.json (mudler/LocalAI 82c191a): every name it emits.
LOCALAI_TOOL_PARSERS = {
    "hermes": json_tools.parse_tool_call,
    "qwen3_xml": None,  # ours (decoding/tool_formats/qwen3_xml.py, vLLM's typing)
    "llama4_pythonic": None,  # ours (pythonic lists, and the Llama JSON reader)
    "llama3_json": None,
    "mistral": None,  # ours: mlx-lm's mistral parser first, then the forms vLLM also reads
    "deepseek_v3": None,
    "glm47": None,  # ours (decoding/tool_formats/glm.py)
    "glm45": None,
    "gemma4": None,  # ours (decoding/tool_formats/gemma4.py)
    "granite4": json_tools.parse_tool_call,
    "minimax_m2": minimax_m2.parse_tool_call,
    "kimi_k2": None,  # ours (decoding/tool_formats/kimi_k2.py)
    "olmo3": None,
    "ernie45": json_tools.parse_tool_call,
    "phi4_mini_json": None,
    "openai": None,
}
LOCALAI_REASONING_PARSERS = {
    "qwen3": ("<think>", "</think>"),
    "deepseek_r1": ("<think>", "</think>"),
    "mistral": ("[THINK]", "[/THINK]"),
    "deepseek_v3": ("<think>", "</think>"),
    "glm45": ("<think>", "</think>"),
    "gemma4": ("<|channel>", "<channel|>"),  # its "thought\n" label: reasoning_formats
    "granite": ("Here is my thought process:", "Here is my response:"),
    "minimax_m2": ("<think>", "</think>"),
    "kimi_k2": ("<think>", "</think>"),
    "nemotron_v3": ("<think>", "</think>"),
    "olmo3": ("<think>", "</think>"),
    "ernie45": ("<think>", "</think>"),
    "openai_gptoss": None,  # Harmony channels, not a marker pair
}


@pytest.mark.parametrize("name", sorted(LOCALAI_TOOL_PARSERS))
def test_every_localai_tool_parser_name_maps_to_a_parser(name: str) -> None:
    parser, start, _ = resolve_tool_parser(name)
    assert callable(parser) and start
    if LOCALAI_TOOL_PARSERS[name] is not None:
        assert parser is LOCALAI_TOOL_PARSERS[name]


@pytest.mark.parametrize("name", sorted(LOCALAI_REASONING_PARSERS))
def test_every_localai_reasoning_parser_name_applies(name: str, tok, caplog) -> None:
    assert resolve_reasoning_markers(name) == LOCALAI_REASONING_PARSERS[name]
    with caplog.at_level("WARNING"):
        t = apply_parser_overrides(tok, reasoning_parser=name)
    assert "keeping what mlx-lm detected" not in caplog.text
    if name == "openai_gptoss" and not seam_tokenizer.takes_response_format():
        assert "has no response formats" in caplog.text and t is tok  # mlx-lm main: none
    elif name == "openai_gptoss":
        assert t.response_transitions == HARMONY_FORMAT["transitions"]
    else:
        assert (t.think_start, t.think_end) == LOCALAI_REASONING_PARSERS[name]


@pytest.mark.parametrize(
    ("tool", "reasoning", "why"),
    [
        ("no_such_parser", "", "unknown tool_parser 'no_such_parser'"),
        ("", "no_such_parser", "unknown reasoning_parser 'no_such_parser'"),
        # a vLLM name with no format here yet, while there is one
        *(
            (n, "", f"tool_parser '{n}' (a vLLM name) has no MLX equivalent")
            for n in sorted(TOOL_PARSERS)[:1]
        ),
        *(
            ("", n, f"reasoning_parser '{n}' (a vLLM name) has no MLX equivalent")
            for n in sorted(NO_FORMAT)[:1]
        ),
    ],
)
def test_other_names_warn_and_keep_mlx_lms_detection(tok, caplog, tool, reasoning, why) -> None:
    """Never a failed load: LocalAI passes options meant for other backends too."""
    lp = params.load_params(
        pb.ModelOptions(Model="m", Options=[f"tool_parser:{tool}", f"reasoning_parser:{reasoning}"])
    )
    with caplog.at_level("WARNING", logger="localai.mlx.decoding.parsers"):
        t = apply_parser_overrides(tok, lp.tool_parser, lp.reasoning_parser)
    assert (
        why in caplog.text and "keeping what mlx-lm detected from the chat template" in caplog.text
    )
    assert "json_tools" in caplog.text or "'<think>' '</think>'" in caplog.text  # what stays
    if "unknown" in why:
        assert "hermes" in caplog.text or "qwen3" in caplog.text  # the names that apply
    assert t.tool_parser is tok.tool_parser and t.tool_call_start == tok.tool_call_start
    assert (t.think_start, t.think_end) == (tok.think_start, tok.think_end)


# --------------------------------------------------------------------------- scripted outputs
def _route(tok, tool: str, reasoning: str, text: str):
    t = apply_parser_overrides(tok, tool, reasoning)
    pipe = OutputPipeline(t)
    deltas = [pipe.feed(i) for i in t.encode(text, add_special_tokens=False)]
    deltas.append(pipe.finish("stop"))
    calls = [(c.name, json.loads(c.arguments)) for c in pipe.tool_calls]
    assert merge_tool_call_deltas(p for d in deltas for p in d.tool_calls) == pipe.tool_calls
    return pipe.reasoning, pipe.content, calls


PARIS = ("get_weather", {"city": "Paris"})
NOW = ("get_time", {})


@pytest.mark.parametrize(
    ("tool", "reasoning", "text", "expected"),
    [
        # Llama 3.x: the format its chat template asks for (vLLM llama_tool_parser.py)
        (
            "llama3_json",
            "",
            '{"name": "get_weather", "parameters": {"city": "Paris"}}',
            ("", "", [PARIS]),
        ),
        (
            "llama3_json",
            "",
            'Sure. {"name": "get_weather", "parameters": {"city": "Paris"}}; '
            '{"name": "get_time", "arguments": {}}',
            ("", "Sure. ", [PARIS, NOW]),
        ),
        # Llama 4's own template asks for the same JSON
        (
            "llama4_pythonic",
            "",
            '{"name": "get_weather", "parameters": {"city": "Paris"}}',
            ("", "", [PARIS]),
        ),
        # DeepSeek V3 / R1, and the V3.1 shape (vLLM deepseekv3 / deepseekv31 parsers)
        (
            "deepseek_v3",
            "deepseek_r1",
            "<think>plan</think>Ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
            'get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
            ("plan", "Ok", [PARIS]),
        ),
        (
            "deepseek_v3",
            "deepseek_v3",
            '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
            "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
            "<｜tool▁calls▁end｜>",
            ("", "", [PARIS, NOW]),
        ),
        # OLMo 3: one pythonic call a line (vLLM olmo3_tool_parser.py)
        (
            "olmo3",
            "olmo3",
            '<think>x</think><function_calls>\nget_weather(city="Paris")\nget_time()\n'
            "</function_calls>",
            ("x", "", [PARIS, NOW]),
        ),
        # Phi-4-mini (vLLM phi4mini_tool_parser.py)
        (
            "phi4_mini_json",
            "",
            'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
            '{"name": "get_time", "parameters": {}}]',
            ("", "", [PARIS, NOW]),
        ),
        # Granite 4 / ERNIE 4.5: hermes-style blocks
        (
            "granite4",
            "",
            '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
            ("", "", [NOW]),
        ),
        (
            "ernie45",
            "ernie45",
            '<think>a</think><tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
            ("a", "", [NOW]),
        ),
        # gpt-oss Harmony: recipient in the channel, and in the role
        (
            "openai",
            "openai_gptoss",
            "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            '{"city":"Paris"}',
            ("Need the weather.", "", [PARIS]),
        ),
        (
            "openai",
            "openai_gptoss",
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
            '{"city": "Paris"}<|call|>',
            ("", "", [PARIS]),
        ),
        (
            "openai",
            "openai_gptoss",
            "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final"
            "<|message|>2 + 2 = 4.",
            ("Simple.", "2 + 2 = 4.", []),
        ),
    ],
)
def test_scripted_outputs_parse_with_the_named_parser(tok, tool, reasoning, text, expected) -> None:
    harmony = any(name.startswith("openai") for name in (tool, reasoning))
    if harmony and not seam_tokenizer.takes_response_format():
        pytest.skip("this mlx-lm's tokenizer has no response formats (Harmony channels)")
    assert _route(tok, tool, reasoning, text) == expected


def test_json_that_is_no_llama_call_stays_content(tok) -> None:
    text = 'As JSON: {"name": "Bob", "age": 3} and more.'
    assert _route(tok, "llama3_json", "", text) == ("", text, [])
