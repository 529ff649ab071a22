"""LLaMA-family models in plain Paddle, their HF checkpoint layout, tokenizer and generation."""
from alignment.models.config import LlamaConfig
from alignment.models.generation import GenerationConfig, generate, generate_without_cache
from alignment.models.llama import CausalLMOutput, LlamaForCausalLM, LlamaModel
from alignment.models.tokenizer import Tokenizer

__all__ = ["LlamaConfig", "LlamaForCausalLM", "LlamaModel", "CausalLMOutput", "GenerationConfig", "generate",
           "generate_without_cache", "Tokenizer"]
