"""Benchmarks: decoding methods against plain decoding and llama.cpp, and the training throughput probes."""
