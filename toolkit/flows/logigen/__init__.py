"""The logigen flow (see ../shared/FLOWS.md): registers its strategies on import."""

from toolkit.flows.logigen import gentask, validate  # noqa: F401,E402  (register gen-task / validate-task)
