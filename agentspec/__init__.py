"""agentspec: lossless retrieval-based speculative decoding for LLM coding agents."""

__version__ = "0.1.0"
