"""Inference outside training: export a checkpoint to a static program with a KV cache (export), load it with
paddle.inference (exported_model) and generate for many prompts through it (batch_generation)."""
