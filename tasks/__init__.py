"""Tasks other than generation: ``scoring`` (Score), ``rerank`` (Rerank), ``embedding``
(Embedding)."""
