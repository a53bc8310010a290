"""The names of the runtime's precisions, importable without torch (the command line's choices, the job spec's
keys); what each means: runtime/precision.py."""

AUTO = "auto"
DTYPES = (AUTO, "float32", "bfloat16")
