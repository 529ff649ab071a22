"""Parallel primitives on paddle.distributed: process groups and rank helpers, tensor-parallel layers, and the
stand-ins for collectives Paddle's CPU build lacks. The layout itself is chosen in alignment/config/layout.py."""
