"""Content-addressed token blocks: how a token sequence is cut, keyed, packed and put back.

A sequence (prompt ids + response ids) is cut into fixed-size blocks from position 0; block
``i`` is keyed by ``blake2b(key[i-1] + packed tokens of block i, 16 bytes)``, so a key names
the block *and its whole prefix*. Two steps that share a prefix share its full blocks, which
are stored once; what is left after the last full block (the tail, < block_size tokens) is
kept inline with the step. Token ids are packed as little-endian uint32, logprobs as
little-endian float64 (exact round trip of Python floats).

Pure functions only; :mod:`swarm.pool.store` does the storing.
"""

from __future__ import annotations

import hashlib
import sys
from array import array

__all__ = ["HASH_BYTES", "pack_ids", "unpack_ids", "pack_floats", "unpack_floats", "cut", "split_hashes"]

HASH_BYTES = 16
_BIG_ENDIAN = sys.byteorder == "big"
assert array("I").itemsize == 4 and array("d").itemsize == 8


def _pack(typecode: str, values: list) -> bytes:
    a = array(typecode, values)
    if _BIG_ENDIAN:
        a.byteswap()
    return a.tobytes()


def _unpack(typecode: str, data: bytes) -> list:
    a = array(typecode)
    a.frombytes(data)
    if _BIG_ENDIAN:
        a.byteswap()
    return a.tolist()


def pack_ids(ids: list[int]) -> bytes:
    """Token ids as little-endian uint32 bytes (OverflowError beyond 2**32 - 1)."""
    return _pack("I", ids)


def unpack_ids(data: bytes) -> list[int]:
    return _unpack("I", data)


def pack_floats(values: list[float]) -> bytes:
    """Floats as little-endian float64 bytes: every Python float round-trips exactly."""
    return _pack("d", values)


def unpack_floats(data: bytes) -> list[float]:
    return _unpack("d", data)


def cut(ids: list[int], block_size: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Cut ``ids`` into full blocks ``[(key, packed tokens), ...]`` and a packed tail."""
    data = pack_ids(ids)
    step = 4 * block_size
    n_full = len(ids) // block_size
    blocks: list[tuple[bytes, bytes]] = []
    prev = b""
    for i in range(n_full):
        chunk = data[i * step : (i + 1) * step]
        prev = hashlib.blake2b(prev + chunk, digest_size=HASH_BYTES).digest()
        blocks.append((prev, chunk))
    return blocks, data[n_full * step :]


def split_hashes(joined: bytes | None) -> list[bytes]:
    """The list of block keys a step stores concatenated in one column."""
    if not joined:
        return []
    return [joined[i : i + HASH_BYTES] for i in range(0, len(joined), HASH_BYTES)]
