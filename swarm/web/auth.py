"""Credentials: per-episode api keys, the client token and the admin token.

An episode api key is ``sk-swarm-`` + base64url(``v1 | nonce | ciphertext | tag``): the episode id
encrypted under a key derived from the gateway secret (HMAC-SHA256 in counter mode as the key
stream) and authenticated with a second derived HMAC key (encrypt-then-MAC, 128-bit tag).

Why this design:

- *Signed*: a key cannot be forged or altered without the secret (the tag is checked in constant
  time before anything else is looked at).
- *Not decodable*: without the secret the key reveals nothing, not even the episode id (unlike
  unsigned base64 JSON); the random nonce makes two keys for one episode unrelated.
- *Stateless*: verifying needs only the secret, so any gateway configured with the same secret
  and pool verifies keys issued by another; nothing is stored per key. Revocation is by episode
  state: a key of an ended episode still verifies but the routes refuse to generate with it.

Standard library only (hmac, hashlib, secrets). It does not rate-limit or expire keys.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from fastapi import Request

from swarm.web.errors import ApiError

__all__ = ["KeySigner", "KEY_PREFIX", "bearer_token", "token_matches", "Caller"]

KEY_PREFIX = "sk-swarm-"
_VERSION = b"\x01"
_NONCE = 12
_TAG = 16


class KeySigner:
    """Issues and verifies episode api keys under one secret."""

    def __init__(self, secret: bytes) -> None:
        self._enc = hmac.new(secret, b"swarm/episode-key/enc", hashlib.sha256).digest()
        self._mac = hmac.new(secret, b"swarm/episode-key/mac", hashlib.sha256).digest()

    def _stream(self, nonce: bytes, n: int) -> bytes:
        out = bytearray()
        counter = 0
        while len(out) < n:
            out += hmac.new(self._enc, nonce + counter.to_bytes(4, "big"), hashlib.sha256).digest()
            counter += 1
        return bytes(out[:n])

    def _tag(self, body: bytes) -> bytes:
        return hmac.new(self._mac, body, hashlib.sha256).digest()[:_TAG]

    def issue(self, episode_id: str) -> str:
        plain = episode_id.encode("utf-8")
        nonce = secrets.token_bytes(_NONCE)
        ct = bytes(a ^ b for a, b in zip(plain, self._stream(nonce, len(plain)), strict=True))
        body = _VERSION + nonce + ct
        return KEY_PREFIX + base64.urlsafe_b64encode(body + self._tag(body)).decode("ascii").rstrip("=")

    def verify(self, key: str) -> str | None:
        """The episode id a key was issued for, or ``None`` if the key is malformed or forged."""
        if not key.startswith(KEY_PREFIX) or len(key) > 1024:
            return None
        raw = key[len(KEY_PREFIX):]
        try:
            blob = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
        except ValueError:
            return None
        if len(blob) <= 1 + _NONCE + _TAG or blob[:1] != _VERSION:
            return None
        body, tag = blob[:-_TAG], blob[-_TAG:]
        if not hmac.compare_digest(tag, self._tag(body)):
            return None
        nonce, ct = body[1 : 1 + _NONCE], body[1 + _NONCE :]
        try:
            return bytes(a ^ b for a, b in zip(ct, self._stream(nonce, len(ct)), strict=True)).decode("utf-8")
        except UnicodeDecodeError:
            return None


def bearer_token(request: Request) -> str | None:
    """The bearer token of a request (``Authorization: Bearer``, or ``api-key`` / ``x-api-key``)."""
    auth = request.headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        raise ApiError(401, "the Authorization header must be 'Bearer <key>'", code="invalid_api_key")
    return request.headers.get("api-key") or request.headers.get("x-api-key") or None


def token_matches(given: str | None, expected: str | None) -> bool:
    return given is not None and expected is not None and hmac.compare_digest(given.encode(), expected.encode())


@dataclass(frozen=True)
class Caller:
    """Who is calling: an episode (through its key), a service (client token) or an admin."""

    episode_id: str | None = None
    service: bool = False
    admin: bool = False

    @property
    def reward_source(self) -> str:
        """Whose reward this caller gives: ``admin`` > ``judge`` (a service) > ``agent`` (an episode key)."""
        return "admin" if self.admin else "judge" if self.service else "agent"

    def may_touch(self, episode_id: str) -> bool:
        return self.service or self.admin or self.episode_id == episode_id
