"""Loading a model: from a name to a ready ``LoadedModel``.

- ``model_loader``: resolve a path, hub id or GGUF and load it with mlx-lm.
- ``hub``: Hugging Face downloads (``huggingface_hub``).
- ``gguf_convert``: GGUF files to mlx-lm weights, config and tokenizer.
- ``cpu_fast_path``: Linux CPU: the fast BLAS preload and dense float32 weights.
- ``cpu_fuse``: fused Q/K/V and compiled norm/rotary on the dense CPU path.
- ``cpu_attention``: attention on the CPU with numpy's vectorized softmax.
- ``host_memory``: the one reader of physical memory and the cgroup limit.
- ``vision``: vision-language models through mlx-vlm (``LMView``, the processor).
- ``loaded_model``: the frozen record of a loaded model, and the one loader that builds it.
"""
