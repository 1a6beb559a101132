"""GPUs: discovery, NVML, memory capacity and placement, host limits, out-of-memory detection."""
