"""On-disk embedding cache: a safetensors file written in a stream, memory-mapped on read, plus a JSON manifest.

Layout of one entry in the cache directory: `<stem>.safetensors` (standard safetensors; tensors readable by
`safetensors.safe_open`) and `<stem>.json` (the manifest: the request that produced it, shapes, dtype, byte size,
sha256 of the file, package versions). Both are written to a temporary file and moved into place with os.replace,
the manifest last, so an interrupted build never leaves an entry that validates.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

from ..base.fingerprints import file_fingerprint
from ..base.paths import user_path

ENV_CACHE = "WSLIGHT_CACHE"
# safetensors dtype codes <-> numpy dtypes.
ST_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32, "I8": np.int8}
NP_TO_ST = {np.dtype(v): k for k, v in ST_DTYPES.items()}


class CacheInvalid(Exception):
    """The cache entry exists but cannot be used (reason in the message)."""


class CacheRebuildWarning(UserWarning):
    """A cache entry was found invalid (mismatched manifest, truncated or corrupt file) and is rebuilt."""


def user_cache_dir() -> Path:
    """The user's cache folder for wslight: `$XDG_CACHE_HOME/wslight`, else `~/.cache/wslight`."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"  # XDG: a relative value is ignored
    return base / "wslight"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else $WSLIGHT_CACHE, else the user cache folder (`user_cache_dir`).

    One cache serves every working directory: the bundled embeddings (about 190 MB) are built once per user.
    """
    if cache_dir:
        return Path(user_path(cache_dir))
    env = os.environ.get(ENV_CACHE)
    return Path(user_path(env)) if env else user_cache_dir()


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` via a temporary file in the same folder and os.replace (atomic on POSIX and Windows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class SafetensorsStreamWriter:
    """Write a safetensors file tensor by tensor, chunk by chunk, without holding the tensors in memory.

    Tensors are declared up front (name -> (numpy dtype, shape)) and their bytes must then be written in declaration
    order, C-contiguous, through `write(name, array)` calls (several calls per tensor allowed, along the first axis).
    `commit()` checks that every byte was written, fsyncs, and moves the temporary file into place; it returns
    (file size, sha256 of the file). Use as a context manager: an exception discards the temporary file.
    """

    def __init__(self, path: Path, tensors: dict[str, tuple[np.dtype, tuple[int, ...]]], metadata: dict[str, str]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        header: dict = {"__metadata__": {k: str(v) for k, v in metadata.items()}}
        self._sizes: list[tuple[str, int]] = []
        offset = 0
        for name, (dtype, shape) in tensors.items():
            dtype = np.dtype(dtype)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            header[name] = {"dtype": NP_TO_ST[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self._sizes.append((name, nbytes))
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors pads the header with spaces to a multiple of 8
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        self._tmp = Path(tmp)
        self._f = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self._put(struct.pack("<Q", len(raw)) + raw)
        self._cur = 0  # index into _sizes
        self._written = 0  # bytes written into the current tensor

    def _put(self, b: bytes | memoryview) -> None:
        self._f.write(b)
        self._hash.update(b)

    def write(self, name: str, array: np.ndarray) -> None:
        """Append bytes of tensor `name` (the next declared tensor, or the one in progress)."""
        while self._cur < len(self._sizes) and self._written == self._sizes[self._cur][1]:
            self._cur, self._written = self._cur + 1, 0
        if self._cur >= len(self._sizes) or self._sizes[self._cur][0] != name:
            expected = self._sizes[self._cur][0] if self._cur < len(self._sizes) else None
            raise RuntimeError(f"safetensors stream: expected bytes of {expected!r}, got {name!r}")
        data = np.ascontiguousarray(array).data.cast("B")  # the array's buffer as bytes
        if self._written + len(data) > self._sizes[self._cur][1]:
            raise RuntimeError(f"safetensors stream: too many bytes for {name!r}")
        self._put(data)
        self._written += len(data)

    def commit(self) -> tuple[int, str]:
        """Flush and fsync the written file and move it to its path; returns its size and sha256."""
        missing = sum(s for _, s in self._sizes[self._cur + 1 :]) + self._sizes[self._cur][1] - self._written
        if missing:
            raise RuntimeError(f"safetensors stream: {missing} bytes were not written")
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        size = self._tmp.stat().st_size
        os.replace(self._tmp, self.path)
        return size, self._hash.hexdigest()

    def abort(self) -> None:
        """Close the file being written and remove it."""
        if not self._f.closed:
            self._f.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> SafetensorsStreamWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def read_header(path: Path) -> tuple[dict, int]:
    """(header dict, byte offset where the data starts) of a safetensors file; CacheInvalid if malformed."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CacheInvalid(f"{path.name}: {size} bytes, too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(size - 8, 100_000_000):
            raise CacheInvalid(f"{path.name}: header length {n} does not fit in a {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CacheInvalid(f"{path.name}: unreadable safetensors header ({e})") from e
    return header, 8 + n


def open_memmap(path: Path, header: dict, start: int, name: str) -> np.ndarray:
    """Read-only numpy memmap of tensor `name` of a safetensors file (no bytes are read until indexed).

    An empty tensor is a plain empty array.
    """
    info = header[name]
    a, b = info["data_offsets"]
    shape = tuple(info["shape"])
    if a == b:
        return np.zeros(shape, dtype=ST_DTYPES[info["dtype"]])  # np.memmap refuses empty maps
    return np.memmap(path, dtype=ST_DTYPES[info["dtype"]], mode="r", offset=start + a, shape=shape)


def read_manifest(path: Path) -> dict:
    """The manifest at `path` as a dict; CacheInvalid when it cannot be read."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CacheInvalid(f"{path.name}: unreadable manifest ({e})") from e


def validate_entry(data: Path, manifest: dict, request: dict, shapes: dict, full: bool = True) -> tuple[dict, int]:
    """Check that a cache entry answers `request` and is intact; return (safetensors header, data offset).

    Checks: the manifest's request equals `request`; the file's byte size equals the manifest's; the header's tensors
    have the expected `shapes` ({name: (dtype code, shape)}); with full=True, the file's sha256 equals the manifest's.

    Raises:
        CacheInvalid: with the reason.
    """
    if manifest.get("request") != request:
        diff = sorted(
            k
            for k in set(request) | set(manifest.get("request") or {})
            if (manifest.get("request") or {}).get(k) != request.get(k)
        )
        raise CacheInvalid(f"{data.name}: manifest does not match the request (differs in {diff})")
    if not data.is_file():
        raise CacheInvalid(f"{data.name}: missing data file")
    size = data.stat().st_size
    if size != manifest.get("file_bytes"):
        raise CacheInvalid(
            f"{data.name}: {size} bytes on disk, the manifest says {manifest.get('file_bytes')} "
            "(truncated or overwritten)"
        )
    header, start = read_header(data)
    for name, (code, shape) in shapes.items():
        info = header.get(name)
        if info is None or info.get("dtype") != code or tuple(info.get("shape", ())) != tuple(shape):
            raise CacheInvalid(f"{data.name}: tensor {name!r} is {info}, expected dtype {code} shape {list(shape)}")
        a, b = info["data_offsets"]
        if start + b > size:
            raise CacheInvalid(f"{data.name}: tensor {name!r} runs past the end of the file")
    if full and file_fingerprint(data) != manifest.get("sha256"):
        raise CacheInvalid(f"{data.name}: sha256 differs from the manifest (corrupt file)")
    return header, start
