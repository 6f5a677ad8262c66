"""Reading large files (multi-GB wheels, the source release) in bounded memory."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

CHUNK = 1 << 20


def read_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    for chunk in read_chunks(path):
        digest.update(chunk)
    return digest.hexdigest()
