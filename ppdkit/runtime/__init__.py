"""Decoding: the lean forward, the drafters (drafter.py), the one decode loop (loop.py) and the Decoder."""
