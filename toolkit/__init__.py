"""Toolkit for synthesizing verifiable multi-turn tool-use data and post-training tool-using agents."""

import os

__version__ = "0.1.0"


def home() -> str:
    """The toolkit's per-user state and cache directory: $TOOLKIT_HOME, default ~/.cache/toolkit
    (the embedded server's state, materialized models, the registry manifest). Not created here."""
    return os.environ.get("TOOLKIT_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "toolkit")
