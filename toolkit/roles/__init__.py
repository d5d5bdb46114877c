"""LLM roles: prompt + parse, nothing else. Each role takes an LLMClient and returns parsed data."""
