"""Fine-tuning, export and quantization jobs: LocalAI's training RPCs on MLX.

Each job runs in a child process (``python -m training.worker``), never on the serving
engine's thread: the gRPC server keeps answering Health and Status, and a stop ends the
child's loop within a step. The parent side (``jobs``) and the request reading (``spec``,
``quant_types``, ``checkpoints``) import no MLX; the child's modules do the work with
mlx-lm's own tools:

- ``spec``: the job requests read into frozen specs (all validation);
- ``quant_types``: ``quantization_type`` names (MLX's, llama.cpp's) -> MLX recipes;
- ``checkpoints``: the checkpoint directory layout, ``ListCheckpoints``;
- ``jobs``: the parent side: one child per job, its progress lines, stop;
- ``worker``: the child's entry: reads the spec, runs it, writes progress lines;
- ``datasets``: local JSONL (chat, prompt/completion, text), bad rows named by line;
- ``finetune``: the training loop over mlx-lm's tuner parts, checkpoints, memory check;
- ``export``: adapter, merged (16-bit, 4-bit) and GGUF exports with mlx-lm's fuse steps;
- ``quantize``: a model into an MLX-quantized one through ``mlx_lm.convert``.
"""
