"""catalog.atomic: a final name holds the whole file or nothing, and temp files go."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from catalog.atomic import atomic_file, atomic_path, write_bytes


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_write_bytes_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    dest = tmp_path / "a.json"
    write_bytes(dest, b"one")
    write_bytes(dest, b"two")
    assert dest.read_bytes() == b"two"
    assert _names(tmp_path) == ["a.json"]


def test_exclusive_keeps_the_existing_file(tmp_path: Path) -> None:
    dest = tmp_path / "key"
    write_bytes(dest, b"first", exclusive=True)
    with pytest.raises(FileExistsError):
        write_bytes(dest, b"second", exclusive=True)
    assert dest.read_bytes() == b"first"
    assert _names(tmp_path) == ["key"]


def test_an_error_in_the_body_publishes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "plan.arrow"
    dest.write_bytes(b"old")
    with pytest.raises(ValueError, match="checksum"), atomic_file(dest) as f:
        f.write(b"half a new file")
        raise ValueError("checksum does not verify")
    assert dest.read_bytes() == b"old"
    assert _names(tmp_path) == ["plan.arrow"]


def test_atomic_path_publishes_what_a_writer_wrote_by_name(tmp_path: Path) -> None:
    dest = tmp_path / "out.bin"
    with atomic_path(dest) as tmp:
        assert tmp.parent == tmp_path and not tmp.exists()
        tmp.write_bytes(b"x" * 10)
        assert not dest.exists()  # nothing under the final name until the end
    assert dest.read_bytes() == b"x" * 10
    assert _names(tmp_path) == ["out.bin"]


def test_atomic_path_without_a_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError), atomic_path(tmp_path / "never"):
        pass
    assert _names(tmp_path) == []


def _race(dest: str, payload: bytes, start: multiprocessing.synchronize.Event) -> None:
    start.wait()
    for _ in range(50):
        write_bytes(Path(dest), payload)


def test_concurrent_writers_leave_one_whole_file(tmp_path: Path) -> None:
    dest = tmp_path / "shared.bin"
    payloads = [bytes([i]) * 65536 for i in range(4)]
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_race, args=(str(dest), p, start)) for p in payloads]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert dest.read_bytes() in payloads
    assert _names(tmp_path) == ["shared.bin"]
