"""A fork server for the erase crash loop: imports once, then runs each erase attempt
in a forked child and SIGKILLs it after the delay it was told (race-free: the child is
not reaped before the kill).

stdin lines: ``run <delay_s>`` (a negative delay: never kill) or ``quit``.
stdout lines: ``done <stage>`` (the child finished), ``killed <stage>`` (killed while in
``<stage>``, the last stage it reported), ``failed <stage>``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
import traceback
from pathlib import Path

# What the child needs, imported before any thread exists (fork safety). Not lancedb:
# importing it starts an async runtime that a forked child may deadlock on, so each
# child imports it afresh (catalog.embeddings does so lazily).
from catalog.catalog import VidlakeCatalog
from catalog.config import CatalogConfig
from catalog.erase import erase_asset
from manifests.erasure import erase_versions
from manifests.registry import Registry


def child(config_path: Path, asset: str, stage_file: Path) -> None:
    faulthandler.dump_traceback_later(60, exit=True)  # a hang shows where, then fails

    def progress(stage: str, fraction: float) -> None:
        with open(stage_file, "a") as f:
            f.write(f"{stage}\n")

    catalog = VidlakeCatalog.open(CatalogConfig.model_validate_json(config_path.read_text()))
    registry = Registry(catalog.objects)

    def versions(plan, packs, expired, report):  # type: ignore[no-untyped-def]
        return erase_versions(registry, plan, packs, expired, report)

    erase_asset(catalog, asset, versions=versions, progress=progress)


def main() -> None:
    config_path, asset, stage_file = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "quit":
            return
        delay = float(args[0])
        stage_file.write_text("start\n")
        pid = os.fork()
        if pid == 0:
            try:
                child(config_path, asset, stage_file)
            except BaseException:
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        deadline = time.monotonic() + delay
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if delay >= 0 and time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.002)
        stage = stage_file.read_text().split()[-1]
        if os.WIFSIGNALED(status):
            outcome = "killed"
        else:
            outcome = "done" if os.WEXITSTATUS(status) == 0 else "failed"
        print(outcome, stage, flush=True)


if __name__ == "__main__":
    main()
