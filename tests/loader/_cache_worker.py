"""A child process for the node-cache tests: ``python _cache_worker.py '<json config>'``.

Modes (``cfg["mode"]``):

``lease``   lease ``cfg["key"]`` once, hash what it gets, print a JSON result.
``hold``    lease ``cfg["key"]``, touch ``cfg["marker"]``, then sleep until killed.
``stall``   start downloading ``cfg["key"]``: write half its bytes, touch the marker,
            sleep until killed (a process dying mid-download).
``hammer``  lease random keys until ``cfg["seconds"]`` pass and ``cfg["min_reads"]`` reads
            were made, hashing every read.

Objects come from ``cfg["src"]``: a directory holding one file per object, named by its
SHA-256 (``src/<sha>``), or, with ``cfg["store"]``, a local object store. Every process
appends what it did to ``cfg["events"]/<pid>.log``, one ``<event> <sha256>`` per line:
``fetch`` (a fetch began), ``evict`` and ``corrupt`` (from the cache's log records),
``read`` (a verified read), ``bad`` (a read whose bytes failed their SHA-256, or a
leased file that vanished), ``flaky`` (a fetch that wrote a corrupt byte on purpose,
with probability ``cfg["flaky"]``), ``refused`` (a lease the cache refused with
ChecksumMismatch) and ``violation`` (a fetch while another fetch of the key ran, or
while the key was resident).

With ``cfg["disk"]`` (``capacity``, ``tenant`` folder, ``lock`` file) the cache sits on a
simulated filesystem of ``capacity`` bytes shared with whatever the test writes into the
tenant folder: the cache's free-space probe sees ``capacity - tenant - cache payload``,
and a fetch that does not fit writes what fits and raises ``OSError(ENOSPC)``, under an
``flock`` that makes "check the room, write" atomic as a real filesystem's allocator is.
Then ``enospc`` (a fetch that hit ENOSPC) and ``diskfull`` (a lease refused with
``CacheFull(reason="disk")``) are logged too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import logging
import os
import pickle
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from catalog.errors import CacheFull, ChecksumMismatch
from loader.cache import NodeCache


class _EventLog(logging.Handler):
    """Writes the cache's evict/corrupt records (they carry ``event`` and ``sha256``)."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(logging.DEBUG)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event:
            self.out.write(f"{event} {record.sha256}\n")
            self.out.flush()


def payload(root: Path, *subs: str) -> int:
    """Bytes of the files under ``root`` (or its ``subs``), tolerating deletions."""
    total = 0
    for sub in subs or ("",):
        for folder, _, files in os.walk(root / sub):
            for name in files:
                with contextlib.suppress(FileNotFoundError):  # deleted while we walk
                    total += os.stat(os.path.join(folder, name)).st_size
    return total


def simulated_free(root: str, disk: dict[str, Any]) -> int:
    """The free-space probe of the simulated filesystem (picklable via partial)."""
    # tmp/ before objects/: a download renamed into place during the walk is counted
    # twice (too little room, safe), never missed (which would overfill the disk).
    used = payload(Path(root), "tmp", "objects") + payload(Path(disk["tenant"]))
    return int(disk["capacity"]) - used


def _write_within(disk: dict[str, Any], root: str, tmp: Path, data: bytes, out: TextIO) -> None:
    """Write ``data`` to ``tmp`` as a full filesystem would: what fits, then ENOSPC."""
    with open(disk["lock"], "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        room = max(simulated_free(root, disk), 0)
        with open(tmp, "wb") as f:
            f.write(data[:room])
    if room < len(data):
        out.write(f"enospc {tmp.name}\n")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))


def _fetcher(cfg: dict[str, Any], cache: NodeCache, out: TextIO) -> Callable[[str], Any]:
    src = Path(cfg["src"])
    markers = Path(cfg["events"]) / "inflight"
    markers.mkdir(exist_ok=True)
    store = None
    flaky = random.Random(os.getpid())
    if cfg.get("store"):
        from catalog.objects import open_store

        store = open_store(str(src))

    def for_key(key: str) -> Callable[[Path], None]:
        def fetch(tmp: Path) -> None:
            out.write(f"fetch {key}\n")
            out.flush()
            marker = markers / key
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                out.write(f"violation {key} concurrent-fetch\n")
                fd = -1
            if cache.path_of(key).exists():
                out.write(f"violation {key} fetched-while-resident\n")
            try:
                time.sleep(cfg.get("fetch_delay_s", 0.0))
                if cfg.get("disk"):
                    data = store.get(key) if store is not None else (src / key).read_bytes()
                    _write_within(cfg["disk"], cfg["root"], tmp, data, out)
                elif store is not None:
                    store.download(key, tmp)
                else:
                    shutil.copyfile(src / key, tmp)
                if flaky.random() < cfg.get("flaky", 0.0):  # a bad transfer
                    out.write(f"flaky {key}\n")
                    with open(tmp, "r+b") as f:
                        byte = f.read(1)
                        f.seek(0)
                        f.write(bytes([byte[0] ^ 0x80]))
            finally:
                if fd >= 0:
                    os.close(fd)
                    marker.unlink()

        return fetch

    return for_key


def _open(cfg: dict[str, Any]) -> NodeCache:
    if cfg.get("pickle"):
        cache = pickle.loads(Path(cfg["pickle"]).read_bytes())
        assert isinstance(cache, NodeCache)
        return cache
    disk = cfg.get("disk")
    return NodeCache(
        cfg["root"],
        cfg["budget"],
        reserve_bytes=0,
        verify_hits=cfg.get("verify_hits", True),
        full_wait_s=cfg.get("full_wait_s", 0.0),
        disk_free=functools.partial(simulated_free, disk=disk) if disk else None,
    )


def _read(
    cache: NodeCache,
    key: str,
    size: int,
    fetch: Callable[[Path], None],
    out: TextIO,
    hold_s: float = 0.0,
) -> None:
    try:
        with cache.lease(key, size, fetch) as path:
            # Open late and check again at the end: a leased file must stay put.
            time.sleep(hold_s)
            data = path.read_bytes()
            time.sleep(hold_s)
            ok = path.exists()
    except ChecksumMismatch:
        out.write(f"refused {key}\n")
        return
    except CacheFull as exc:
        if exc.details.get("reason") != "disk":
            raise
        out.write(f"diskfull {key}\n")
        return
    except FileNotFoundError:
        ok = False
        data = b""
    ok = ok and len(data) == size and hashlib.sha256(data).hexdigest() == key
    out.write(f"{'read' if ok else 'bad'} {key}\n")


def main(cfg: dict[str, Any]) -> None:
    events = Path(cfg["events"])
    events.mkdir(parents=True, exist_ok=True)
    with open(events / f"{os.getpid()}.log", "a", buffering=1) as out:
        logger = logging.getLogger("vidlake.cache")
        logger.setLevel(logging.DEBUG)
        logger.addHandler(_EventLog(out))
        cache = _open(cfg)
        fetch_for = _fetcher(cfg, cache, out)
        mode = cfg["mode"]
        if mode == "lease":
            _read(cache, cfg["key"], cfg["size"], fetch_for(cfg["key"]), out)
        elif mode == "hold":
            with cache.lease(cfg["key"], cfg["size"], fetch_for(cfg["key"])):
                Path(cfg["marker"]).touch()
                time.sleep(120)
        elif mode == "stall":
            if cfg.get("store"):
                from catalog.objects import open_store

                data = open_store(cfg["src"]).get(cfg["key"])
            else:
                data = (Path(cfg["src"]) / cfg["key"]).read_bytes()

            def stall(tmp: Path) -> None:
                tmp.write_bytes(data[: len(data) // 2])
                Path(cfg["marker"]).touch()
                time.sleep(120)

            with cache.lease(cfg["key"], cfg["size"], stall):
                pass
        elif mode == "hammer":
            keys = [(k, s) for k, s in cfg["keys"]]
            rng = random.Random(cfg["seed"])
            # At least ``seconds`` and at least ``min_reads`` reads (a loaded box must not
            # turn the hammer into a tap), but never more than ten times ``seconds``.
            start = time.monotonic()
            deadline, cap = start + cfg["seconds"], start + 10 * cfg["seconds"]
            reads, min_reads = 0, cfg.get("min_reads", 0)
            while (time.monotonic() < deadline or reads < min_reads) and time.monotonic() < cap:
                # Skewed popularity, so that there are hits as well as evictions.
                key, size = keys[int(len(keys) * rng.random() ** 2)]
                _read(cache, key, size, fetch_for(key), out, cfg.get("hold_s", 0.0))
                reads += 1
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        print(json.dumps(cache.stats()))
        cache.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
