"""A large batch's SHA-256s are computed in a worker process (``catalog.hash_worker``),
off this process's GIL, with the same bytes as ``hashlib``; where the worker cannot
answer (dead, busy, a forked child's inherited one) the batch is hashed here."""

from __future__ import annotations

import hashlib
import os
import threading
import warnings

import numpy as np
import pyarrow as pa
import pytest

from catalog import _sha_worker, hash_worker, rules


def _messages(n: int) -> pa.Array:
    texts = [f"{i:064x}:{i / 7:.6f}:é{'x' * (i % 9)}".encode() for i in range(n)]
    texts[n // 2] = b""  # an empty message has a digest too
    return pa.array(texts, pa.large_binary())


def _expected(messages: pa.Array, width: int) -> bytes:
    return b"".join(hashlib.sha256(m).digest()[:width] for m in messages.to_pylist())


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hashing in this process fails the test: only the worker may answer."""

    def refuse(messages: pa.Array, width: int) -> bytes:
        raise AssertionError("hashed in this process")

    monkeypatch.setattr(hash_worker, "_here", refuse)


@pytest.mark.parametrize("width", [32, 16, 1])
def test_a_large_batch_is_hashed_by_the_worker(here: None, width: int) -> None:
    messages = _messages(hash_worker.MIN_ROWS + 5)
    assert hash_worker.sha256_prefixes(messages, width) == _expected(messages, width)


def test_a_slice_is_sent_from_its_own_offsets(here: None) -> None:
    messages = _messages(hash_worker.MIN_ROWS + 100).slice(37, hash_worker.MIN_ROWS + 2)
    assert hash_worker.sha256_prefixes(messages, 16) == _expected(messages, 16)


def test_clip_ids_of_a_large_batch_are_the_rules_ids(here: None) -> None:
    n = hash_worker.MIN_ROWS + 1
    assets = [hashlib.sha256(str(i % 300).encode()).hexdigest() for i in range(n)]
    start = np.arange(n, dtype=np.float64) * 0.25
    end = start + 2.0000005  # every end is a half-microsecond case: formatted by Python
    got = rules.clip_ids(pa.array(assets), start, end, pa.array(["v1"] * n)).to_pylist()
    assert got == [
        rules.clip_id(a, s, e, "v1")
        for a, s, e in zip(assets, start.tolist(), end.tolist(), strict=True)
    ]


def test_a_small_batch_is_hashed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(messages: pa.Array) -> bytes:
        raise AssertionError("sent to the worker")

    monkeypatch.setattr(hash_worker._WORKER, "ask", refuse)
    messages = _messages(hash_worker.MIN_ROWS - 1)
    assert hash_worker.sha256_prefixes(messages, 32) == _expected(messages, 32)


def test_a_dead_worker_is_replaced_and_its_batch_hashed_here(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    worker = hash_worker._Worker()
    monkeypatch.setattr(hash_worker, "_WORKER", worker)
    messages = _messages(hash_worker.MIN_ROWS)
    assert hash_worker.sha256_prefixes(messages, 32) == _expected(messages, 32)
    proc = worker._proc
    assert proc is not None
    proc.kill()
    proc.wait()
    assert hash_worker.sha256_prefixes(messages, 32) == _expected(messages, 32)
    assert "SHA-256 worker failed" in caplog.text
    assert worker._proc is None
    assert hash_worker.sha256_prefixes(messages, 32) == _expected(messages, 32)
    assert worker._proc is not None  # a new one
    worker.close()


def test_a_busy_worker_leaves_the_batch_to_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = hash_worker._Worker()
    monkeypatch.setattr(hash_worker, "_WORKER", worker)
    messages = _messages(hash_worker.MIN_ROWS)
    with worker._lock:  # another thread's batch is in it
        assert hash_worker.sha256_prefixes(messages, 32) == _expected(messages, 32)
    assert worker._proc is None


def test_workers_that_keep_failing_are_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    worker = hash_worker._Worker()
    monkeypatch.setattr(hash_worker, "_WORKER", worker)
    monkeypatch.setattr(hash_worker, "_SCRIPT", hash_worker._SCRIPT.with_name("missing.py"))
    messages = _messages(hash_worker.MIN_ROWS)
    for _ in range(hash_worker._MAX_FAILURES + 2):
        assert hash_worker.sha256_prefixes(messages, 32) == _expected(messages, 32)
    assert worker._failures == hash_worker._MAX_FAILURES
    assert worker._proc is None


def test_threads_share_the_worker_and_get_their_own_answers() -> None:
    batches = [_messages(hash_worker.MIN_ROWS + k) for k in range(6)]
    got: dict[int, bytes] = {}

    def run(k: int) -> None:
        got[k] = hash_worker.sha256_prefixes(batches[k], 16)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {k: _expected(b, 16) for k, b in enumerate(batches)}


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="width"):
        hash_worker.sha256_prefixes(_messages(3), 33)
    with pytest.raises(ValueError, match="large_binary"):
        hash_worker.sha256_prefixes(pa.array([b"a", None], pa.large_binary()), 32)


def test_the_worker_protocol() -> None:
    offsets = np.array([0, 3, 3, 8], np.int64).tobytes()
    assert _sha_worker.answer(offsets, b"abcdefgh") == b"".join(
        hashlib.sha256(m).digest() for m in (b"abc", b"", b"defgh")
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_does_not_use_its_parents_worker() -> None:
    messages = _messages(hash_worker.MIN_ROWS)
    hash_worker.sha256_prefixes(messages, 32)  # the parent's worker is up
    parent = hash_worker._WORKER._proc
    read, write = os.pipe()
    with warnings.catch_warnings():  # 3.12+ warns of forking beside threads; the child
        warnings.simplefilter("ignore", DeprecationWarning)  # below uses none of them
        pid = os.fork()
    if pid == 0:  # the child: answers right, from a worker of its own or here
        ok = hash_worker._WORKER._proc is None and hash_worker.sha256_prefixes(
            messages, 32
        ) == _expected(messages, 32)
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.waitpid(pid, 0)
    assert hash_worker._WORKER._proc is parent
    assert hash_worker.sha256_prefixes(messages, 32) == _expected(messages, 32)


def test_a_request_interrupted_midway_retires_its_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its answer may still land in the shared file: the next batch must not read it.
    worker = hash_worker._Worker()
    monkeypatch.setattr(hash_worker, "_WORKER", worker)
    messages = _messages(hash_worker.MIN_ROWS)
    hash_worker.sha256_prefixes(messages, 32)
    first = worker._proc
    real = hash_worker._exchange

    def interrupted(*args: object) -> bytes:
        raise KeyboardInterrupt

    monkeypatch.setattr(hash_worker, "_exchange", interrupted)
    with pytest.raises(KeyboardInterrupt):
        hash_worker.sha256_prefixes(messages, 32)
    assert worker._proc is None and first is not None and first.returncode is not None
    monkeypatch.setattr(hash_worker, "_exchange", real)
    assert hash_worker.sha256_prefixes(messages, 32) == _expected(messages, 32)
    worker.close()


def test_no_worker_without_an_interpreter_to_run_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A frozen application's sys.executable is the application itself.
    worker = hash_worker._Worker()
    monkeypatch.setattr(hash_worker, "_WORKER", worker)
    monkeypatch.setattr(hash_worker.sys, "frozen", True, raising=False)
    messages = _messages(hash_worker.MIN_ROWS)
    assert hash_worker.sha256_prefixes(messages, 32) == _expected(messages, 32)
    assert worker._proc is None
