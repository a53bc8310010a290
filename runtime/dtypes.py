"""The names of the runtime's precisions, importable without torch (the command line's choices, the job spec's
keys); what each means: runtime/precision.py."""

AUTO = "auto"
GGUF = "gguf"  # the matmuls on the base model's own GGUF blocks (4-bit Q4_1, 8-bit Q8_0), not on floats
DTYPES = (AUTO, "float32", "bfloat16", GGUF)
