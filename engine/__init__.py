"""The engine: the one thread that makes every MLX call, and what runs on it.

- ``core``: ``Engine``, the thread, its mailbox and the async API the servicer awaits.
- ``scheduler``: the running set: admission, the batch, solo runs, checkpoints, retire.
- ``jobs``: ``Job``, one request in flight, and the events it sends back.
- ``model_host``: the model slot: load, serve, unload.
- ``model_calls``: tokenize, metadata, Score and Embedding calls on the loaded model.
- ``prompt``: render and tokenize a request (on a worker thread, never MLX).
"""
