"""The logigen flow (see ../shared/FLOWS.md): registers its strategies on import."""

from toolkit.flows.logigen import gentask  # noqa: F401,E402  (registers gen-task)
