"""FlashInfer's own test suite: the plan, the per-file runs, the pytest plugin, the run summary."""
