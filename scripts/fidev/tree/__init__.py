"""The vendored FlashInfer tree: what it is, the release it came from, the kernel families and their sources."""
