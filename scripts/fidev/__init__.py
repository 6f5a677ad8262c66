"""Shared logic of the FlashInfer developer workspace's scripts (standard library only)."""
