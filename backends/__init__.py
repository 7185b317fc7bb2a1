"""Engines that verify drafts: oracle replay, MLX, vLLM; and model loading."""
