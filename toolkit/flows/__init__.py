"""One package per flow (logigen, eigendata, astra, simia): its roles, deterministic analysis and
the strategies it registers with `toolkit.stages.registry`. Importing a flow package must stay
cheap (register only; heavy imports inside functions): `--help` imports every flow."""
