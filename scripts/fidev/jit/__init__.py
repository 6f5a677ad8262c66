"""FlashInfer's JIT as the workspace drives it: module names, the kernel-source mode, the per-module choice,
the toolchain."""
