"""The Slurm backend: a sweep\x27s runs as job arrays on a Slurm cluster (see launcher.py)."""
