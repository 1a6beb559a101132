"""The sweep engine: the loop, its decisions, the launcher interface, outcomes."""
