"""What users read after (or during) a sweep: status, notifications."""
