"""Fingerprints of files (base floor: standard library only): what the data and encoder caches key on."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_fingerprint(path: Path, full: bool = True, chunk: int = 1 << 22) -> str:
    """sha256 of a file (full), or of its size plus first and last `chunk` bytes (full=False, for large files)."""
    h = hashlib.sha256()
    size = path.stat().st_size
    with open(path, "rb") as f:
        if full or size <= 2 * chunk:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
        else:
            h.update(str(size).encode())
            h.update(f.read(chunk))
            f.seek(size - chunk)
            h.update(f.read(chunk))
    return h.hexdigest()
