"""The global step plan: which manifest rows every global step trains on.

A plan is a pure function of (phases, seed): no clocks, no hidden state, no platform
dependent sort ties. Per phase (docs/plan.md derives every bound quoted here):

1. **Buckets** (:mod:`.buckets`). Step ``t``'s bucket comes from an
   earliest-deadline-first schedule over the shares ``sigma_b``: after every prefix of
   ``t`` steps bucket ``b`` has ``|steps_b - t * sigma_b| <= 1``. ``sigma_b`` is
   proportional to the bucket's weighted sample count divided by its global batch, so
   every pool drains at one rate (:mod:`.layout`).
2. **Streams** (:mod:`.quotas`). Inside bucket ``b`` stream ``k`` has the conditional
   weight ``u_kb``. Cumulative quotas are largest remainder with carried deficits along
   a Huffman tree of two-way splits (house-monotone, so never a negative count, and a
   closed form of the cumulative count, so vectorised across steps).
3. **Rows** (:mod:`.draw`). Each (stream, bucket) pool walks seeded permutations of its
   rows, a fresh one per epoch, only when the previous is exhausted; where an epoch
   starts inside a step, the old epoch's rows already in the step are deferred in the
   new one, so no step holds a row twice unless a pool is smaller than its per-step
   quota, which a phase must allow explicitly. Rows are then shuffled within the step
   so that every rank's contiguous slice carries the mixture (:mod:`.steps`).

Randomness is counter based (:mod:`.rng`: splitmix64 of (seed, purpose,
coordinates)), so the output does not depend on how steps are chunked, and every sort
key is unique. The other modules: :mod:`.spec` (the inputs), :mod:`.scatter` (the
write-time order of manifest rows), :mod:`.summary` (what a plan realized) and
:mod:`.write` (``plan.arrow`` on disk), :mod:`.lineage` (``lineage.arrow`` from a
written plan, by an external sort), :mod:`.parallel` (generation per step range on an
executor, the same bytes). Each module imports only those listed before it in this
docstring's dependency order: rng, spec, lineage < scatter, buckets, quotas < layout <
draw < steps < summary, parallel < write.
"""

from materializer.plan.buckets import bucket_schedule
from materializer.plan.layout import PhaseLayout, plan_layout
from materializer.plan.quotas import cumulative_quotas
from materializer.plan.scatter import scatter_keys, scatter_order, scatter_permutation
from materializer.plan.spec import MAX_GLOBAL_BATCH, PhaseSpec, Pool
from materializer.plan.steps import (
    DEFAULT_BATCH_ROWS,
    DEFAULT_BATCH_STEPS,
    StepChunk,
    generate_steps,
)
from materializer.plan.summary import PhaseSummary, PlanSummary
from materializer.plan.write import write_plan

__all__ = [
    "DEFAULT_BATCH_ROWS",
    "DEFAULT_BATCH_STEPS",
    "MAX_GLOBAL_BATCH",
    "PhaseLayout",
    "PhaseSpec",
    "PhaseSummary",
    "PlanSummary",
    "Pool",
    "StepChunk",
    "bucket_schedule",
    "cumulative_quotas",
    "generate_steps",
    "plan_layout",
    "scatter_keys",
    "scatter_order",
    "scatter_permutation",
    "write_plan",
]
