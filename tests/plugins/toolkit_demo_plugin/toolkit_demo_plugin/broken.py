"""A plugin module that fails at import (tests: a broken plugin is reported, never fatal)."""

raise ImportError("toolkit_demo_plugin.broken needs a package that is not installed")
