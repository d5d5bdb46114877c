"""Toolkit for synthesizing verifiable multi-turn tool-use data and post-training tool-using agents."""

__version__ = "0.1.0"
