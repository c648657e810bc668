"""Test doubles around synthetic snapshots: sources that count or corrupt what they
serve, and a loopback HTTP server with the service's loader-facing endpoints.

The snapshots themselves come from :mod:`manifests.synthetic`, which publishes them
through the real writers (:mod:`manifests.ipc`, :class:`manifests.registry.Registry`).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from catalog.objects import ObjectStore, open_store
from loader.source import SnapshotSource, StoreSource
from manifests.format import registry_key

__all__ = ["CorruptingSource", "CountingSource", "serve_http"]


class CountingSource(StoreSource):
    """A store source that appends one line per artifact download to ``log_path``.

    Importable by spawned processes, so several of them can share the count.
    """

    def __init__(self, url: str, log_path: str) -> None:
        super().__init__(open_store(url))
        self.log_path = log_path

    def download_artifact(self, version: int, name: str, sha256: str, dest: Path) -> None:
        with open(self.log_path, "a") as f:
            f.write(f"{name}\n")
        super().download_artifact(version, name, sha256, dest)


class CorruptingSource(StoreSource):
    """A store source that flips one byte of every object, artifact or range it serves.

    With ``artifacts=False`` the plan and index come through intact, so the snapshot
    opens and only latents are corrupt.
    """

    def __init__(self, inner: SnapshotSource | ObjectStore, *, artifacts: bool = True) -> None:
        store = inner.store if isinstance(inner, StoreSource) else inner
        assert isinstance(store, ObjectStore)
        super().__init__(store)
        self.artifacts = artifacts

    def download_artifact(self, version: int, name: str, sha256: str, dest: Path) -> None:
        if self.artifacts:
            self.fetch_object(sha256, dest)
        else:
            StoreSource.fetch_object(self, sha256, dest)

    def read_range(self, sha256: str, offset: int, length: int) -> bytes:
        data = bytearray(super().read_range(sha256, offset, length))
        data[len(data) // 2] ^= 0xFF
        return bytes(data)

    def fetch_object(self, sha256: str, dest: Path) -> None:
        super().fetch_object(sha256, dest)
        data = bytearray(Path(dest).read_bytes())
        data[len(data) // 2] ^= 0xFF
        Path(dest).write_bytes(bytes(data))


class _Handler(BaseHTTPRequestHandler):
    """The loader-facing endpoints of the vidlake service, served from a store."""

    store: ObjectStore
    corrupt_header = False
    requests: list[str]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, *, head: bool) -> None:
        self.requests.append(f"{self.command} {self.path} {self.headers.get('Range', '')}")
        parts = self.path.strip("/").split("/")
        try:
            if parts[:2] == ["v1", "objects"] and len(parts) == 3:
                data, sha = self.store.get(parts[2]), parts[2]
            elif parts[:2] == ["v1", "snapshots"] and len(parts) in (3, 5):
                entry = json.loads(self.store.get_key(registry_key(int(parts[2]))))
                doc = self.store.get(entry["snapshot_sha256"])
                if len(parts) == 3:
                    data, sha = doc, entry["snapshot_sha256"]
                else:
                    sha = json.loads(doc)["artifacts"][parts[4]]["sha256"]
                    data = self.store.get(sha)
            else:
                raise KeyError(self.path)
        except Exception:
            self.send_error(404)
            return
        status, body = 200, data
        rng = self.headers.get("Range")
        if rng:
            start_s, end_s = rng.removeprefix("bytes=").split("-")
            start, end = int(start_s), min(int(end_s), len(data) - 1)
            status, body = 206, data[start : end + 1]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Vidlake-SHA256", "0" * 64 if self.corrupt_header else sha)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if not head:
            self.wfile.write(body)


@contextlib.contextmanager
def serve_http(
    store: ObjectStore, *, corrupt_header: bool = False
) -> Iterator[tuple[str, list[str]]]:
    """Serve ``store`` on a loopback port the way the vidlake service does for loaders.

    Yields ``(base_url, requests)``; ``requests`` logs every request line.
    """
    requests: list[str] = []
    handler = type(
        "Handler",
        (_Handler,),
        {"store": store, "corrupt_header": corrupt_header, "requests": requests},
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
