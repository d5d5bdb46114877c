"""The logigen flow (see ../shared/FLOWS.md): registers its strategies on import."""
