"""The local launcher: one fresh process per run on this machine."""
