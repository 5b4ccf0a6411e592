"""Content-addressed token blocks: how a token sequence is cut, keyed, packed and put back.

A sequence (prompt ids + response ids) is cut into fixed-size blocks from position 0; block
``i`` is keyed by ``blake2b(key[i-1] + its tokens as uint32, 16 bytes)``, so a key names the
block *and its whole prefix*, and each block row also names its predecessor (``prev``): a step
stores only the key of its last full block, its **head**, and reading walks the chain back.
Two steps that share a prefix share its blocks, which are stored once; what is left after the
last full block (the tail, < block_size tokens) is kept inline with the step.

Byte formats, all little-endian, each told apart by its length so that rows written by older
versions read back unchanged:

- tokens (a block's or a tail): uint16 when every id is < 2**16, else uint32, followed by one
  byte naming the width (2 or 4): an odd length. An even length is the older format, uint32
  without the width byte.
- a step's ``block_keys``: its head key and the byte ``0x01`` (17 bytes), or empty when the
  sequence has no full block. A multiple of 16 bytes is the older format: every key in order.
  Chained keys are hashed under their own personalisation, so a chain never runs into a block
  of the older format (whose ``prev`` is unknown).
- logprobs: float32 followed by the byte ``0x01`` when every value is a float32 (what sampling
  on torch or vLLM records), else float64: an exact round trip of Python floats either way.

Chat messages (a step's ``prompt_messages``) are chained the same way, one message a link
(:func:`chain_messages`): the history a conversation repeats at every call is stored once.

:func:`pack_ids` / :func:`pack_floats` (plain uint32 / float64, no width byte) stay the canonical
encodings that keys and step digests hash.

Pure functions only; :mod:`swarm.pool.store` does the storing.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from typing import NamedTuple

__all__ = ["HASH_BYTES", "chain_messages", "unpack_message", "pack_ids", "unpack_ids", "pack_floats", "unpack_floats",
           "pack_tokens", "unpack_tokens", "pack_logprobs", "cut", "Cut", "head_of", "split_hashes"]

HASH_BYTES = 16
CHAIN = b"\x01"  # the byte after a head key in ``block_keys``; also float32 logprobs' trailing byte
_PERSON = b"swarm.chain.v2"  # chained keys never equal the older, unchained ones
_MESSAGES = b"swarm.msgs.v1"
_BIG_ENDIAN = sys.byteorder == "big"
assert array("I").itemsize == 4 and array("H").itemsize == 2 and array("d").itemsize == 8 and array("f").itemsize == 4


def _pack(typecode: str, values: list) -> bytes:
    a = array(typecode, values)
    if _BIG_ENDIAN:
        a.byteswap()
    return a.tobytes()


def _unpack(typecode: str, data: bytes | memoryview) -> list:
    a = array(typecode)
    a.frombytes(data)
    if _BIG_ENDIAN:
        a.byteswap()
    return a.tolist()


def pack_ids(ids: list[int]) -> bytes:
    """Token ids as little-endian uint32 bytes (OverflowError beyond 2**32 - 1): the canonical form keys hash."""
    return _pack("I", ids)


def unpack_ids(data: bytes) -> list[int]:
    return _unpack("I", data)


def pack_floats(values: list[float]) -> bytes:
    """Floats as little-endian float64 bytes: every Python float round-trips exactly."""
    return _pack("d", values)


def unpack_floats(data: bytes) -> list[float]:
    """Logprobs as stored: float64, or float32 and the byte ``0x01`` (see :func:`pack_logprobs`)."""
    if len(data) % 2:
        return _unpack("f", memoryview(data)[:-1])
    return _unpack("d", data)


def pack_logprobs(values: list[float]) -> bytes:
    """Logprobs in the fewest bytes that give them back exactly: float32 (and ``0x01``) when every value
    is one, else float64."""
    if not values:
        return b""
    f32 = array("f", values)
    if f32.tolist() == values:
        if _BIG_ENDIAN:
            f32.byteswap()
        return f32.tobytes() + CHAIN
    return pack_floats(values)


def pack_tokens(ids: list[int]) -> bytes:
    """Token ids as stored in a block or a tail: uint16 (and ``0x02``) when they all fit, else uint32 (and
    ``0x04``); empty for no ids. OverflowError beyond 2**32 - 1 (and for negative ids)."""
    if not ids:
        return b""
    try:
        return _pack("H", ids) + b"\x02"
    except OverflowError:
        return _pack("I", ids) + b"\x04"


def unpack_tokens(data: bytes | memoryview) -> list[int]:
    """Token ids from :func:`pack_tokens`'s bytes, or from the older plain uint32 (an even length)."""
    n = len(data)
    if n % 2 == 0:
        return _unpack("I", data)
    return _unpack("H" if data[-1] == 2 else "I", memoryview(data)[:-1])


def cut(ids: list[int], block_size: int, known: Cut | None = None) -> Cut:
    """Cut ``ids`` into full blocks ``[(key, packed tokens), ...]`` and a packed tail.

    Block ``i``'s predecessor is block ``i - 1`` (none for the first). Keys hash the uint32 form, so a
    block's key does not depend on the width it is stored in. ``known``: an earlier cut (of the same conversation's
    previous step): its blocks over the prefix the two sequences share are taken as they are, not hashed and packed
    again, so a step costs what it adds, not its whole context.
    """
    data = pack_ids(ids)  # OverflowError for ids beyond uint32, before anything is cut
    step = 4 * block_size
    n_full = len(ids) // block_size
    k = 0 if known is None else _shared_blocks(data, known.data, step, min(n_full, len(known.blocks)))
    blocks: list[tuple[bytes, bytes]] = known.blocks[:k] if known is not None else []
    prev = blocks[-1][0] if blocks else b""
    for i in range(k, n_full):
        chunk = data[i * step : (i + 1) * step]
        prev = hashlib.blake2b(prev + chunk, digest_size=HASH_BYTES, person=_PERSON).digest()
        blocks.append((prev, pack_tokens(ids[i * block_size : (i + 1) * block_size])))
    return Cut(blocks, pack_tokens(ids[n_full * block_size :]), data)


class Cut(NamedTuple):
    """A sequence cut by :func:`cut`: its full blocks, its packed tail, and its uint32 bytes (for a later cut)."""

    blocks: list[tuple[bytes, bytes]]
    tail: bytes
    data: bytes


def _shared_blocks(data: bytes, known: bytes, step: int, most: int) -> int:
    """How many leading blocks of ``step`` bytes ``data`` and ``known`` share (at most ``most``): a binary search of
    prefix comparisons (equal prefixes only grow shorter towards the start)."""
    if most and data[: most * step] == known[: most * step]:
        return most
    lo, hi = 0, most  # data[:lo * step] matches, data[:hi * step] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if data[: mid * step] == known[: mid * step]:
            lo = mid
        else:
            hi = mid
    return lo


def chain_messages(messages: list, prev: bytes = b"") -> list[tuple[bytes, bytes]]:
    """Chat messages as chained ``[(key, UTF-8 JSON with sorted keys), ...]``: message ``i``'s key hashes
    message ``i - 1``'s key and its own bytes, so it names the whole history up to it. ``prev``: the key of the
    message before ``messages[0]`` when a chain is continued (:class:`swarm.pool.prefixes.PrefixMemo`)."""
    out: list[tuple[bytes, bytes]] = []
    for m in messages:
        data = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
        prev = hashlib.blake2b(prev + data, digest_size=HASH_BYTES, person=_MESSAGES).digest()
        out.append((prev, data))
    return out


def unpack_message(data: bytes) -> object:
    """One message of :func:`chain_messages` back."""
    return json.loads(data.decode("utf-8", "surrogatepass"))


def head_of(blocks: list[tuple[bytes, bytes]]) -> bytes:
    """What a step stores as ``block_keys`` for ``blocks`` (from :func:`cut`): the last key and ``0x01``."""
    return blocks[-1][0] + CHAIN if blocks else b""


def split_hashes(joined: bytes | None) -> list[bytes]:
    """The keys an older step stores concatenated in ``block_keys`` (not a head: see :func:`head_of`)."""
    if not joined:
        return []
    return [joined[i : i + HASH_BYTES] for i in range(0, len(joined), HASH_BYTES)]
