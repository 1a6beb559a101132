"""Digests of text (run names, configs, commands), without loading OpenSSL.

``import hashlib`` loads OpenSSL's libcrypto to offer all its algorithms: 2.3 ms of a start's
~80 ms on a 2-core VM. The two digests gts uses, SHA-256 and BLAKE2b, are also built into CPython
as small modules of their own, which hashlib itself falls back to: the same digests for 0.5 ms.
A Python built without them gets hashlib's.
"""

from __future__ import annotations

try:
    from _sha2 import sha256  # Python 3.12 and later
except ImportError:
    try:
        from _sha256 import sha256  # Python 3.10 and 3.11
    except ImportError:
        from hashlib import sha256
try:
    from _blake2 import blake2b
except ImportError:
    from hashlib import blake2b


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate (a file name's stray byte) is kept


def sha256_hex(text: str) -> str:
    """The SHA-256 digest of ``text``'s UTF-8, in hex.

    >>> sha256_hex("")[:16]
    'e3b0c44298fc1c14'
    """
    return sha256(_utf8(text)).hexdigest()


def sha256_int(text: str) -> int:
    """The first 8 bytes of the SHA-256 digest, as an unsigned big-endian integer."""
    return int.from_bytes(sha256(_utf8(text)).digest()[:8], "big")


def blake2b_8(text: str) -> bytes:
    """An 8-byte BLAKE2b digest."""
    return blake2b(_utf8(text), digest_size=8).digest()
