"""The Rust bindings' tools: exported signatures, ELF, module artifacts, Cargo pins, the wheel cache."""
