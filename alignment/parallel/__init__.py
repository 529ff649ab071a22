"""Hybrid (3D) parallelism on paddle.distributed.fleet: topology, tensor-parallel layers, CPU stand-ins, offload."""
