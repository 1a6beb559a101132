"""What a sweep writes down: the ledger and its lock, run folders, the files between scheduler and run."""
