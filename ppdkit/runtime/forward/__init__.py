"""The base model's forward and its precisions: the lean Llama forward (llama.py) on a preallocated KV cache, its
linear layers in float32, bfloat16 or a GGUF's own blocks, and the row invariance losslessness rests on."""
