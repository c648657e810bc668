"""One example per ``vidlake`` command, shown at the end of its ``--help``.

:func:`attach` sets each command's epilog from :data:`EXAMPLES` (keyed by the command
path as typed, e.g. ``"cache stats"``); ``tests/service/test_cli_help.py`` fails when
a command has none, so a new command cannot ship without one. The scope a command
needs over ``--url`` is stated in the same line (``docs/api.md`` has the table).
"""

from __future__ import annotations

import typer

__all__ = ["EXAMPLES", "attach"]

_URL = "--url http://127.0.0.1:8321"

#: command path -> example command lines (the scope it needs over --url, if any).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "config": ("vidlake config",),
    "serve": ("VIDLAKE_TOKENS_FILE=tokens.yaml vidlake serve --host 0.0.0.0 --port 8321",),
    "ingest": (
        "vidlake ingest clips clips.parquet --idempotency-key clips-0001",
        f"vidlake ingest embeddings vectors.arrow {_URL}   # scope: write",
    ),
    "upload": (f"vidlake upload latents/*.safetensors {_URL}   # scope: write",),
    "schema": ("vidlake schema", f"vidlake schema clips {_URL}   # scope: read"),
    "tombstone": (
        f"vidlake tombstone ASSET_ID --reason 'licence revoked' {_URL}   # scope: write",
        f"vidlake tombstone ASSET_ID --kind hard --erase --reason 'GDPR' {_URL}   # scope: admin",
    ),
    "erase": (f"vidlake erase ASSET_ID --reason 'GDPR request 118' {_URL}   # scope: admin",),
    "erasures": (f"vidlake erasures {_URL}   # scope: read",),
    "cut": (
        "vidlake cut docs/recipes/demo.yaml --dry-run",
        f"vidlake cut my-recipe.yaml {_URL}   # scope: cut",
        "vidlake cut my-recipe.yaml --executor ray://ray-head:10001 --partitions 512",
    ),
    "validate": (f"vidlake validate my-recipe.yaml {_URL}   # scope: read",),
    "snapshots": (f"vidlake snapshots {_URL}   # scope: read",),
    "show": (f"vidlake show 3 --json {_URL}   # scope: read",),
    "diff": (f"vidlake diff 2 3 {_URL}   # scope: read",),
    "report": ("vidlake report 3", f"vidlake report 3 --json {_URL}   # scope: read"),
    "patch": (
        "vidlake patch 3 --clip CLIP_ID --reason 'corrupt latent'",
        f"vidlake patch 3 --where 'stream = 1 AND bucket = 0' --reason 'bad shard' {_URL}"
        "   # scope: cut",
    ),
    "pin": (f"vidlake pin 3 --reason 'paper run' {_URL}   # scope: cut",),
    "unpin": (f"vidlake unpin 3 {_URL}   # scope: cut",),
    "sql": (
        'vidlake sql "SELECT source, count(*) AS n FROM assets GROUP BY source"',
        f"vidlake sql 'SELECT 1' {_URL}   # scope: read",
    ),
    "lineage": (f"vidlake lineage CLIP_ID {_URL}   # scope: read",),
    "step": (f"vidlake step 3 5000 {_URL}   # scope: read",),
    "jobs": (f"vidlake jobs {_URL}   # scope: read",),
    "maintain": (f"vidlake maintain {_URL}   # scope: admin",),
    "gc": ("vidlake gc", f"vidlake gc --apply {_URL}   # scope: admin"),
    "demo": ("vidlake demo --assets 3000",),
    "cache stats": ("vidlake cache stats --dir /local/nvme/vidlake-cache",),
    "cache verify": ("vidlake cache verify --dir /local/nvme/vidlake-cache",),
    "cache gc": ("vidlake cache gc --dir /local/nvme/vidlake-cache --target 100000000000",),
    "storage inventory": ("vidlake storage inventory --snapshot 7 --out inv-v7.jsonl",),
    "storage upload": (
        "vidlake storage upload inv-v7.jsonl --name v7 --bucket B --prefix lake --workers 16",
    ),
    "storage seal": (
        "vidlake storage seal --inventory inv-v7.jsonl --receipts receipts/v7.jsonl "
        "--bucket B --prefix lake --out sealed/",
    ),
    "storage restore": (
        "vidlake storage restore --restore-spec sealed/restore_spec.json --out /new/home",
    ),
    "storage cleanup-check": (
        "vidlake storage cleanup-check /data/latents --inventory inv-v7.jsonl "
        "--receipts receipts/v7.jsonl --restore-spec sealed/restore_spec.json",
    ),
    "storage watch": ("vidlake storage watch /data/incoming --bucket B --prefix lake",),
    "import tar-shards": ("vidlake import tar-shards s3://bucket/shards/ --verify",),
    "import tar-shards-verify": ("vidlake import tar-shards-verify --json",),
    "import corrupt-members": (f"vidlake import corrupt-members {_URL}   # scope: read",),
    "drift": (
        "vidlake drift aesthetic v1 v2 --threshold 0.5",
        f"vidlake drift aesthetic v1 v2 --json {_URL}   # scope: read",
    ),
    "reference-slice": (f"vidlake reference-slice --clips {_URL} > slice.txt   # scope: read",),
    "coverage": (f"vidlake coverage my-recipe.yaml {_URL}   # scope: read",),
    "tags list": (f"vidlake tags list {_URL}   # scope: read",),
    "tags backfill": (f"vidlake tags backfill {_URL}   # scope: admin",),
    "dedup fit": (
        f"vidlake dedup fit --model siglip-v2 --cluster-size 5000 {_URL}   # scope: admin",
    ),
    "dedup list": (
        f"vidlake dedup list --model siglip-v2 --cluster-size 5000 {_URL}   # scope: read",
    ),
    "export tar-shards": ("vidlake export tar-shards --snapshot 3 --out /data/shards",),
}


def _name(info: typer.models.CommandInfo) -> str:
    assert info.callback is not None
    return info.name or info.callback.__name__.lower().replace("_", "-")


def attach(app: typer.Typer, prefix: str = "") -> None:
    """Give every command of ``app`` (and of its groups) its example as the epilog;
    ``\\b`` keeps click from re-wrapping the lines."""
    for info in app.registered_commands:
        lines = EXAMPLES.get(f"{prefix}{_name(info)}")
        if lines:
            info.epilog = "\b\nExample:\n" + "\n".join(f"  {line}" for line in lines)
    for group in app.registered_groups:
        assert group.typer_instance is not None and group.name is not None
        attach(group.typer_instance, f"{prefix}{group.name} ")
