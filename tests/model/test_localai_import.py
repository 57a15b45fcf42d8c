"""Issue 25, done when: a model file exactly as LocalAI's importer writes it loads and serves
with the parsers LocalAI named.

For a Llama 3.2, a Qwen3.5 and a gpt-oss ``mlx-community`` repo, the YAML below is what
``local-ai models import https://huggingface.co/mlx-community/<repo>`` installs:
core/gallery/importers/mlx.go builds it (``model`` = the URL as given, ``LocalModelPath``;
sampling from core/config/inference_defaults.json; ``options`` from
core/config/parser_defaults.json), core/gallery/models.go re-marshals it with yaml.v3
(sorted keys). Each repo is a tiny random-weight model of that mlx-lm architecture
(tests/tiny_models.py) served by the loopback hub (tests/hubserver.py, HF_ENDPOINT), with
the environment LocalAI gives a spawned backend (HF_HOME, TRANSFORMERS_CACHE and
HUGGINGFACE_HUB_CACHE = the models directory: pkg/model/initializers.go).

LoadModel and the requests are built as LocalAI's Go code builds them
(``localai_model_options`` / ``localai_predict_options``) and go over real gRPC to the
real servicer and engine (tests/inprocess.py). A tiny random model cannot be trusted to
write a tool call, so the parser is checked twice: ModelMetadata reports the named
parser's markers for the loaded model, and a scripted model with the downloaded repo's
tokenizer and the same options replies with the family's real tool-call text, which comes
back as a parsed tool call.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import tiny_models
import yaml
from hubserver import HubServer
from inprocess import InProcessServer
from mlx_lm import tokenizer_utils
from scripted import ScriptedModel

import backend_pb2 as pb
import params
from prompting import render as prompt_mod
from seam import tokenizer as seam_tokenizer
from seam.tokenizer import vocab_size

# The importer's files as installed in <models>/<name>.yaml (keys sorted by yaml.v3).
IMPORTED = {
    "llama": """\
backend: mlx
description: Imported from https://huggingface.co/mlx-community/Llama-3.2-1B-Instruct-4bit
known_usecases:
    - chat
name: Llama-3.2-1B-Instruct-4bit
options:
    - tool_parser:llama3_json
parameters:
    min_p: 0.1
    model: https://huggingface.co/mlx-community/Llama-3.2-1B-Instruct-4bit
    repeat_penalty: 1
    temperature: 1.5
    top_k: -1
    top_p: 0.95
template:
    use_tokenizer_template: true
""",
    "qwen3_5": """\
backend: mlx
description: Imported from https://huggingface.co/mlx-community/Qwen3.5-9B-4bit
known_usecases:
    - chat
name: Qwen3.5-9B-4bit
options:
    - tool_parser:qwen3_xml
    - reasoning_parser:qwen3
parameters:
    min_p: 0
    model: https://huggingface.co/mlx-community/Qwen3.5-9B-4bit
    presence_penalty: 1.5
    repeat_penalty: 1
    temperature: 0.7
    top_k: 20
    top_p: 0.8
template:
    use_tokenizer_template: true
""",
    "gpt_oss": """\
backend: mlx
description: Imported from https://huggingface.co/mlx-community/gpt-oss-20b-MXFP4-Q8
known_usecases:
    - chat
name: gpt-oss-20b-MXFP4-Q8
options:
    - tool_parser:openai
    - reasoning_parser:openai_gptoss
parameters:
    min_p: 0.01
    model: https://huggingface.co/mlx-community/gpt-oss-20b-MXFP4-Q8
    repeat_penalty: 1
    temperature: 1
    top_k: 0
    top_p: 1
template:
    use_tokenizer_template: true
""",
}

# What ModelMetadata reports for each once loaded: (format_type or None for a parser of
# ours, section_start, section_end, reasoning_start, reasoning_end).
MARKERS = {
    "llama": (None, '{"name"', "", "", ""),
    "qwen3_5": ("qwen3_xml", "<tool_call>", "</tool_call>", "<think>", "</think>"),
    "gpt_oss": (None, " to=functions.", "", "<|channel|>analysis<|message|>", "<|end|>"),
}

# Each family's own tool-call text (its chat template's format) and what it parses to.
TOOL_REPLIES = {
    "llama": ('{"name": "get_weather", "parameters": {"city": "Paris"}}', ""),
    "qwen3_5": (
        "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "\nThe user wants the weather.\n",
    ),
    "gpt_oss": (
        "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
        '{"city":"Paris"}',
        "The user wants the weather.",
    ),
}
TOOLS = json.dumps(
    [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather of a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
)


def localai_model_options(cfg: dict, models: Path) -> pb.ModelOptions:
    """ModelOptions as LocalAI sends them for ``cfg`` (a model file with no extra keys).

    core/backend/options.go grpcModelOpts: ContextSize 4096 when unset
    (EffectiveContextSize), NBatch 512 (EffectiveBatchSize), a random Seed (getSeed with
    RAND_SEED -1), FlashAttention "auto", NGPULayers 99999999, MMap true (SetDefaults),
    Threads 4, Options verbatim; pkg/model/initializers.go: Model = parameters.model as
    written, ModelFile = filepath.Join(ModelPath, Model) (pkg/model/loader.go), ModelPath.
    """
    model = cfg["parameters"]["model"]
    return pb.ModelOptions(
        Model=model,
        ModelFile=os.path.normpath(os.path.join(models, model)),  # Go's Join also cleans
        ModelPath=str(models),
        ContextSize=cfg.get("context_size") or 4096,
        NBatch=512,
        Seed=random.randint(0, 2**31 - 1),
        Threads=4,
        MMap=True,
        NGPULayers=99999999,
        FlashAttention="auto",
        Options=cfg.get("options", []),
    )


def localai_predict_options(cfg: dict, user: str, tools: str = "") -> pb.PredictOptions:
    """A chat request as LocalAI builds it from ``cfg`` (core/backend/options.go
    gRPCPredictOpts, core/backend/llm.go): the model file's sampling, a fresh random Seed,
    LocalAI's fixed defaults (TypicalP and TailFreeSamplingZ 1, Mirostat ETA/TAU),
    ModelIdentity = parameters.model, Tokens 0 (max_tokens unset)."""
    p = cfg["parameters"]
    req = pb.PredictOptions(
        ModelIdentity=p["model"],
        Temperature=p["temperature"],
        TopP=p["top_p"],
        TopK=p["top_k"],
        MinP=p["min_p"],
        Penalty=p.get("repeat_penalty", 0),
        PresencePenalty=p.get("presence_penalty", 0),
        Seed=random.randint(0, 2**31 - 1),
        Threads=4,
        PromptCacheAll=True,
        MMap=True,
        MirostatETA=0.1,
        MirostatTAU=5.0,
        TailFreeSamplingZ=1.0,
        TypicalP=1.0,
        UseTokenizerTemplate=cfg["template"]["use_tokenizer_template"],
        Tools=tools,
    )
    req.Messages.add(role="user", content=user)
    return req


def _repo(cfg: dict) -> str:
    return cfg["parameters"]["model"].removeprefix("https://huggingface.co/")


@pytest.fixture(scope="module")
def configs() -> dict[str, dict]:
    return {family: yaml.safe_load(text) for family, text in IMPORTED.items()}


@pytest.fixture(scope="module")
def mlx_community(configs, tmp_path_factory):
    """The loopback hub serving a tiny model of each family under its mlx-community name."""
    root = tmp_path_factory.mktemp("tiny")
    server = HubServer()
    for family, cfg in configs.items():
        server.add_repo(_repo(cfg), tiny_models.build(family, root))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def models(mlx_community, tmp_path_factory):
    """LocalAI's models directory, with the environment LocalAI gives a spawned backend."""
    models = tmp_path_factory.mktemp("models")
    with pytest.MonkeyPatch.context() as mp:
        for name in ("HF_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
            mp.delenv(name, raising=False)
        for name in ("HF_HOME", "TRANSFORMERS_CACHE", "HUGGINGFACE_HUB_CACHE"):
            mp.setenv(name, str(models))  # pkg/model/initializers.go, when unset
        mp.setenv("HF_ENDPOINT", mlx_community.url)
        yield models


@pytest.fixture(scope="module")
def backend(models):
    srv = InProcessServer()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.mark.parametrize("family", sorted(IMPORTED))
def test_imported_model_file_loads_and_serves(
    family, configs, models, backend, mlx_community, caplog
):
    cfg = configs[family]
    with caplog.at_level("WARNING", logger="localai.mlx.decoding.parsers"):
        res = backend.stub.LoadModel(localai_model_options(cfg, models), timeout=300)
    assert res.success, res.message
    assert "keeping what mlx-lm detected" not in caplog.text  # every named parser applied
    # Downloaded where huggingface_hub puts it under LocalAI: <models>/models--owner--name.
    cache = models / ("models--" + _repo(cfg).replace("/", "--"))
    assert (cache / "snapshots").is_dir() and not (models / "hub").exists()
    assert any(r.path.startswith(f"/{_repo(cfg)}/resolve/") for r in mlx_community.requests)

    meta = backend.stub.ModelMetadata(pb.ModelOptions(), timeout=60)
    fmt, start, end, think_start, think_end = MARKERS[family]
    tf = meta.tool_format
    assert (tf.section_start, tf.section_end) == (start, end)
    assert (tf.reasoning_start, tf.reasoning_end) == (think_start, think_end)
    if fmt is not None:
        assert tf.format_type == fmt

    # Served with LocalAI's request: TopK -1 for Llama 3.2, a random seed, Tools, Tokens 0.
    req = localai_predict_options(cfg, "What's the weather in Paris?", TOOLS)
    replies = list(backend.stub.PredictStream(req, timeout=300))
    assert replies and replies[-1].tokens > 0


@pytest.mark.parametrize("family", sorted(IMPORTED))
def test_tool_call_reply_is_parsed_by_the_named_parser(family, configs, models, backend):
    """The repo's own tokenizer (downloaded above) and the model file's options, on a
    scripted model that writes the family's tool-call text."""
    cfg = configs[family]
    snapshots = models / ("models--" + _repo(cfg).replace("/", "--")) / "snapshots"
    snapshot = next(snapshots.iterdir())
    tok = tokenizer_utils.load(snapshot)
    text, reasoning = TOOL_REPLIES[family]
    script = tok.encode(text, add_special_tokens=False)
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id)
    srv = InProcessServer(model, tok, options=cfg["options"])
    try:
        req = localai_predict_options(cfg, "What's the weather in Paris?", TOOLS)
        req.ModelIdentity = ""  # the scripted model is installed as "scripted"
        prompt_len = len(prompt_mod.prepare_prompt(params.prompt_spec(req), tok).token_ids)
        model.set_script(prompt_len, script)
        replies = list(srv.stub.PredictStream(req, timeout=120))
    finally:
        srv.stop()
    deltas = [d for r in replies for d in r.chat_deltas]
    calls = [(c.name, c.arguments) for d in deltas for c in d.tool_calls if c.name or c.arguments]
    names = [name for name, _ in calls if name]
    arguments = "".join(args for _, args in calls)
    assert names == ["get_weather"], deltas
    assert json.loads(arguments) == {"city": "Paris"}
    if family == "gpt_oss" and not seam_tokenizer.takes_response_format():
        return  # no Harmony channels in this mlx-lm: the analysis text is not routed
    assert "".join(d.reasoning_content for d in deltas) == reasoning
    assert "".join(d.content for d in deltas).strip() == ""
