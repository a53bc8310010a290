"""The native kernels: C++ sources built for this CPU on first use (native.py), and their PyTorch twins (twin.py),
rounding for rounding."""
