"""The engine: the one thread that makes every MLX call, and what runs on it.

- ``core``: ``Engine``, the thread and the async API the servicer awaits; ``mailbox``: what
  reaches the thread (typed items); ``status``: what Status, GetMetrics and the gauges report.
- ``scheduler``: the running set: admission (by count, and by memory), retire,
  cancel, the prompt cache's lookups and inserts, the per-request log line.
- ``runner``: the interface (``Runner``, ``Batch``) of the kinds of running sequence;
  ``sequences``: those kinds (the continuous batch, solo runs); ``step_budget``: how much
  prefill one batch step may do; ``checkpoints``: prefill snapshots for caches that cannot
  be trimmed.
- ``jobs``: ``Job``, one request's event-loop handle, and the events it sends back;
  ``sequence``: ``Sequence``, the engine's record of it; ``delivery``: one hand-off of
  events per engine step; ``request_log``: a finished request's log line and metrics.
- ``preemption``: admission by memory, preemption and resumption; ``memory``: the memory
  budget; ``sharing``: requests that arrive together prefill a shared prefix once;
  ``divergence``: where a prompt parted from the prompt cache.
- ``model_host``: the model slot: load, serve, unload; ``warmup``: the request path run once
  at LoadModel; ``model_calls``: tokenize, detokenize and metadata of the loaded model.
  Score, Rerank and Embedding are ``tasks/``, which ``core.TASKS`` runs (prepare pool, then
  this thread).
- ``prepare``: a request's one trip to a worker pool before the engine (parse, constraint
  compile, render and tokenize with ``prompting.render``, the fit decisions of
  ``prompting.fit``); ``vision_prompt`` and ``vision``: image prompts (worker thread) and
  their prefill.
- ``metrics``: the Prometheus series the engine reports to.
"""
