"""Checkpoints in other formats into this project's Hugging Face layout: GGUF files (from_gguf), PaddleNLP checkpoints
(from_paddlenlp) and LoRA adapters merged onto their base (merge_adapter). Import the module you need: from_gguf needs
the optional `gguf` package."""
