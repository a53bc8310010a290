"""Decoding: the Decoder (decoder.py) and the one decode loop (loop.py) it runs every method through.

Its rooms: forward/ (the base model's forward and precisions), kernels/ (native code and its twins), drafters/,
trees/ (the trees verified and their sizing), batching/ (many answers at once)."""
