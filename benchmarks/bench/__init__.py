"""Measurements behind benchmarks/benchmark.py: timing and the machine's matmul
peak, training speed, decoding speed. Figures, never pass/fail tests."""
