"""Index a TAR archive by reading only its headers, through ranged reads.

A TAR is a sequence of 512-byte headers, each followed by its member's data padded to
512 bytes, ended by two zero blocks. :func:`index_tar` walks the headers: it reads a
small window at each header it cannot already see, parses the header, and jumps over
the data — so a shard of 60 latents of 25 MB costs about one small read per sample,
not 1.5 GB. Small members the caller asks for (sidecar ``.json`` files) are returned
inline from the same windows.

POSIX ustar and GNU headers are parsed by :mod:`tarfile` (checksum included); pax
(``x``) and GNU long-name (``L``) records are applied to the member that follows.
Anything else that is not a regular file (directories, links) is skipped.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field

from catalog.errors import IntegrityError

__all__ = ["BLOCK", "TarIndex", "TarMember", "index_tar"]

BLOCK = 512
#: Bytes read at a header the window does not cover: the header, a typical sidecar
#: and the next header fit.
DEFAULT_WINDOW = 2048

ReadRange = Callable[[int, int], bytes]


@dataclass(frozen=True)
class TarMember:
    """One regular file of a TAR: its name and where its bytes are."""

    name: str
    offset: int  #: of the data (after the header)
    size: int
    header_offset: int


@dataclass
class TarIndex:
    """Members in archive order, inline data of the small ones, and the cost."""

    members: list[TarMember] = field(default_factory=list)
    inline: dict[str, bytes] = field(default_factory=dict)
    bytes_read: int = 0
    requests: int = 0


class _Window:
    """Reads through one cached window, so consecutive headers cost one request."""

    def __init__(self, read: ReadRange, size: int, window: int, index: TarIndex) -> None:
        self.read, self.size, self.window, self.index = read, size, window, index
        self.start, self.buf = 0, b""

    def get(self, offset: int, n: int) -> bytes:
        end = min(offset + n, self.size)
        if not (self.start <= offset and end <= self.start + len(self.buf)):
            want = min(max(n, self.window), self.size - offset)
            self.buf = self.read(offset, want)
            self.start = offset
            self.index.requests += 1
            self.index.bytes_read += len(self.buf)
        return self.buf[offset - self.start : end - self.start]


def _pad(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK * BLOCK


def index_tar(
    read: ReadRange,
    size: int,
    *,
    inline: Callable[[str, int], bool] = lambda name, size: name.endswith(".json"),
    window: int = DEFAULT_WINDOW,
    what: str = "tar",
) -> TarIndex:
    """Index a TAR of ``size`` bytes read through ``read(offset, length)``.

    Args:
        read: Returns ``length`` bytes at ``offset`` (a ranged GET).
        size: The archive's exact size (from its manifest).
        inline: ``(name, size) -> bool``: members whose bytes to return in ``inline``.
        window: Bytes read at a header the previous read does not cover.
        what: Names the archive in errors.

    Raises:
        IntegrityError: a header is corrupt, or a member runs past ``size``.
    """
    index = TarIndex()
    win = _Window(read, size, max(window, BLOCK), index)
    pos = 0
    pending_name: str | None = None
    while pos + BLOCK <= size:
        block = win.get(pos, BLOCK)
        if len(block) < BLOCK:
            raise IntegrityError(f"{what}: short read at header offset {pos}", offset=pos)
        if block == b"\0" * BLOCK:
            break  # end-of-archive marker
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise IntegrityError(f"{what}: bad header at offset {pos}: {exc}", offset=pos) from exc
        data_at = pos + BLOCK
        if data_at + info.size > size:
            raise IntegrityError(
                f"{what}: member {info.name!r} at {data_at} (+{info.size}) runs past the end "
                f"({size} bytes)",
                offset=pos,
            )
        if info.type in (tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME):
            raw = win.get(data_at, info.size)
            pending_name = _long_name(raw, info.type) or pending_name
        elif info.type in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE):
            name = pending_name or info.name
            pending_name = None
            member = TarMember(name, data_at, info.size, pos)
            index.members.append(member)
            if inline(name, info.size):
                index.inline[name] = win.get(data_at, info.size)
        else:
            pending_name = None
        pos = data_at + _pad(info.size)
    return index


def _long_name(raw: bytes, kind: bytes) -> str | None:
    """The path a pax record or GNU long-name member gives the next member."""
    if kind == tarfile.GNUTYPE_LONGNAME:
        return raw.rstrip(b"\0").decode("utf-8", "surrogateescape")
    pos, name = 0, None
    while pos < len(raw):  # records: "<len> <key>=<value>\n"
        space = raw.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(raw[pos:space])
        except ValueError:
            break
        record = raw[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        if key == b"path":
            name = value.decode("utf-8", "surrogateescape")
        pos += length
    return name
