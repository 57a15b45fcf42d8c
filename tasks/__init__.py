"""Tasks other than generation: ``scoring`` (the Score RPC) and ``embedding``."""
