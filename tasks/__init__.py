"""Tasks other than generation: ``scoring`` (Score), ``rerank`` (Rerank), ``embedding``
(Embedding). Each has ``prepare_on(loaded, *request)`` (measure and tokenize: any thread, no
MLX; its result names the model it was made for, ``model_key``) and ``run_on(loaded, cache,
prepared, should_stop)`` (the forward calls: the engine thread), which the engine calls
directly (`engine.core.TASKS`)."""
