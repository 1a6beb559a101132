"""Launchers: how a run's process is started, watched and stopped (the engine's seam)."""
