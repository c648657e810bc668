"""Cut requests, idempotent on their inputs.

``POST /v1/snapshots`` resolves the recipe's pin when the request arrives (``latest``
becomes snapshot ids) and computes the cut's inputs key
(:func:`manifests.inputs.cut_inputs_sha256`: recipe SHA-256, resolved pin, code
version). Then, unless the caller asks for a new version:

1. a published version with that key answers the request (the newest such version);
2. else a cut job with that key that is queued, running or has succeeded is joined
   (:meth:`service.jobs.JobRunner.submit_once`, atomic across threads and processes;
   a succeeded one answers with its version);
3. else the recipe is checked against the catalog at that pin
   (:func:`materializer.validate.check_recipe`: a typo'd model, filter version or
   stream is a 422 that starts no job), and a new job cuts at exactly that pin.

A job that loses the race for a version number to a *different* cut still fails with
the registry's ``conflict``, as before.

Where the cut's selection runs (:func:`cut_execution`: an executor and a number of
``clip_id`` partitions, from the request or else the settings ``cut_executor`` and
``cut_partitions``) is not an input: the artifacts are the same for every choice, so it
is recorded in the job's parameters, not in the inputs key. A request over HTTP may
name ``local``, ``local:N``, ``auto`` or the server's own Ray address, never another
cluster (the server would connect to it).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from catalog.errors import InvalidInput
from manifests.inputs import cut_inputs_sha256, find_published
from manifests.registry import SnapshotRecord
from service.jobs import JobRecord

if TYPE_CHECKING:
    from materializer.recipe import Recipe
    from materializer.select import Execution
    from service.deps import Services
    from service.settings import Settings

__all__ = ["CutOutcome", "cut_execution", "submit_cut"]


@dataclass(frozen=True)
class CutOutcome:
    """Either the published version that has the inputs, or the job that makes it."""

    record: SnapshotRecord | None = None
    job: JobRecord | None = None
    created: bool = False


def cut_execution(
    settings: Settings,
    executor: str | None = None,
    partitions: int | None = None,
    *,
    any_cluster: bool = False,
) -> Execution | None:
    """The execution a cut runs with: ``executor`` and ``partitions`` where given,
    else the settings'; None for one partition in this process (the plain cut).
    ``any_cluster`` lets the caller name any ``ray://`` address (the CLI in process).

    Raises:
        InvalidInput: A bad executor spec, a partition count out of range, or (without
            ``any_cluster``) a Ray address other than the server's own.
    """
    from materializer.executors import open_executor, parse_executor
    from materializer.partition import MAX_PARTITIONS
    from materializer.select import Execution

    spec = parse_executor(executor or settings.cut_executor)
    count = partitions if partitions is not None else settings.cut_partitions
    if not 1 <= count <= MAX_PARTITIONS:
        raise InvalidInput(
            f"partitions {count}: expected 1..{MAX_PARTITIONS}", field="partitions", value=count
        )
    own = {"auto", settings.cut_executor, settings.ray_cluster()}
    if executor and spec.kind == "ray" and not any_cluster and spec.address not in own:
        raise InvalidInput(
            f"executor {spec.address!r}: this server cuts on its own Ray cluster only "
            "('auto', or its ray_address)",
            field="executor",
            value=spec.address,
        )
    if spec.kind == "local" and count == 1:
        return None
    scratch = str(settings.cut_scratch) if settings.cut_scratch is not None else None
    return Execution(open_executor(spec, ray_address=settings.ray_cluster()), count, scratch)


def submit_cut(
    services: Services,
    recipe: Recipe,
    *,
    new_version: bool,
    owner: str | None,
    executor: str | None = None,
    partitions: int | None = None,
    any_cluster: bool = False,
) -> CutOutcome:
    """Answer a cut request (see the module docstring); ``executor`` and
    ``partitions`` as in :func:`cut_execution`."""
    from materializer.cut import check_plan_fits, code_version, resolve_pin
    from materializer.validate import check_recipe

    execution = cut_execution(services.settings, executor, partitions, any_cluster=any_cluster)
    where = {"execution": execution} if execution is not None else {}

    catalog, registry, cut = services.catalog, services.registry, services.cut
    pin = resolve_pin(catalog, recipe)
    key = cut_inputs_sha256(recipe.sha256(), pin.to_dict(), code_version())
    reader = services.reader
    if not new_version:
        found = find_published(reader.versions(), reader.record, key)
        if found is not None:
            return CutOutcome(record=found)
    # The job would fail on it anyway; refusing now starts no job (a 422 to the caller).
    check_recipe(catalog, recipe, pin)
    check_plan_fits(recipe, tempfile.gettempdir())

    def run(progress: Any) -> dict[str, Any]:
        record = cut(catalog, registry, recipe, progress, pin=pin, **where)
        return {
            "version": record.version,
            "snapshot_sha256": record.entry.snapshot_sha256,
            "recipe_sha256": record.entry.recipe_sha256,
            "inputs_sha256": key,
        }

    params = {
        "recipe_name": recipe.name,
        "recipe_sha256": recipe.sha256(),
        "inputs_sha256": key,
        "catalog_snapshot_ids": pin.to_dict(),
        "new_version": new_version,
        "executor": str(executor or services.settings.cut_executor),
        "partitions": execution.partitions if execution is not None else 1,
    }
    runner = services.runner
    if new_version:
        # Recorded under the key: identical requests arriving while it runs join it.
        job = runner.submit("cut", run, params, owner=owner, key=key)
        return CutOutcome(job=job, created=True)
    job, created = runner.submit_once("cut", run, params, key=key, owner=owner)
    version = (job.result or {}).get("version")
    if not created and job.state == "succeeded" and isinstance(version, int):
        return CutOutcome(record=reader.record(version))
    return CutOutcome(job=job, created=created)
