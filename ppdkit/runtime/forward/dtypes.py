"""The names of the runtime's precisions, importable without torch (the command line's choices, the job spec's
keys); what each means: runtime/forward/precision.py."""

AUTO = "auto"
GGUF = "gguf"  # the matmuls on the base model's own GGUF blocks (4-bit Q4_1, 8-bit Q8_0), not on floats
Q4 = "q4"  # the same blocks quantized by ppdkit from the float weights: for a base model without a GGUF
BLOCK_FORMATS = (GGUF, Q4)  # the formats the int8 kernel multiplies
DTYPES = (AUTO, "float32", "bfloat16", GGUF, Q4)
