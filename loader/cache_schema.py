"""The node cache's SQLite schema (:mod:`loader.cache`): tables, triggers, queries.

``stats`` keeps exact entry and byte totals through triggers, so a reservation never
sums over every row; ``EVICTABLE`` lists ready, unleased entries in LRU order;
``LEASED_BYTES`` sums the ready bytes under a lease.
"""

from __future__ import annotations

__all__ = ["EVICTABLE", "LEASED_BYTES", "SCHEMA", "SCHEMA_VERSION", "STATS"]

SCHEMA_VERSION = "1"
STATS = (
    "entries",
    "bytes",
    "reserved",
    "hits",
    "misses",
    "bytes_downloaded",
    "evictions",
    "corrupt_refetches",
    "reclaimed",
)


def _trigger(event: str, when: str, terms: tuple[tuple[str, str], ...]) -> str:
    """A trigger that keeps the entry and byte totals in ``stats`` exact, so that no
    reservation needs a SUM over every row."""
    body = [
        f"UPDATE stats SET value = value {sign} CASE WHEN {row}.state = '{state}'"
        f" THEN {value} ELSE 0 END WHERE name = '{stat}';"
        for sign, row in terms
        for stat, value, state in (
            ("entries", "1", "ready"),
            ("bytes", f"{row}.size", "ready"),
            ("reserved", f"{row}.size", "downloading"),
        )
    ]
    return (
        f"CREATE TRIGGER IF NOT EXISTS entries_{event} AFTER {when} ON entries "
        f"BEGIN {' '.join(body)} END"
    )


SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS stats (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS entries (
        sha256 TEXT PRIMARY KEY, size INTEGER NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('downloading', 'ready')),
        gen TEXT NOT NULL, pid INTEGER, pid_start INTEGER, pid_ns INTEGER,
        last_access INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS entries_lru ON entries (state, last_access)",
    """CREATE TABLE IF NOT EXISTS leases (
        id INTEGER PRIMARY KEY, sha256 TEXT NOT NULL, pid INTEGER NOT NULL,
        pid_start INTEGER NOT NULL, pid_ns INTEGER NOT NULL, at INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS leases_key ON leases (sha256)",
    _trigger("insert", "INSERT", (("+", "NEW"),)),
    _trigger("delete", "DELETE", (("-", "OLD"),)),
    # Only state and size move the totals; hits update last_access and skip this.
    _trigger("update", "UPDATE OF state, size", (("-", "OLD"), ("+", "NEW"))),
]
EVICTABLE = """SELECT sha256, size FROM entries AS e WHERE state = 'ready'
    AND NOT EXISTS (SELECT 1 FROM leases AS l WHERE l.sha256 = e.sha256) ORDER BY last_access"""
# Ready bytes under a lease: walks the (few) leases, not the (many) entries.
LEASED_BYTES = """SELECT COALESCE(SUM(e.size), 0) FROM (SELECT DISTINCT sha256 FROM leases) AS l
    JOIN entries AS e ON e.sha256 = l.sha256 WHERE e.state = 'ready'"""
