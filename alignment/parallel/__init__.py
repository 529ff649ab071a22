"""Parallel primitives on paddle.distributed: the process layout a run asks for (layout.py), process groups and
rank helpers, tensor-parallel layers, and the stand-ins for collectives Paddle's CPU build lacks."""
