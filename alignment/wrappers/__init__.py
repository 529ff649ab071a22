"""Model wrappers that place whole models across processes and memory: pipeline-parallel stages, whole copies of
split models (resharding), host offload between phases. Above the models; no training logic."""
