"""What loading a recipe changed that its author should hear about.

Stream weights that do not sum to one (``0.5/0.3/0.3``) are normalised when the recipe
loads (:class:`~materializer.recipe.schedule.Phase`). That is a convenience, but it may
also be a typo, so it is never silent: ``vidlake validate`` and ``vidlake cut`` print
each note as a warning, and a cut records them under ``notes`` in ``snapshot.json``.
A recipe rebuilt from its canonical form (already normalised) has no notes.
"""

from __future__ import annotations

from materializer.recipe.model import Recipe

__all__ = ["recipe_notes"]


def recipe_notes(recipe: Recipe) -> list[str]:
    """One sentence per phase whose weights were normalised, naming the new weights."""
    notes = []
    for i, phase in enumerate(recipe.phases):
        given = phase.given_weight_sum
        if given is None:
            continue
        weights = ", ".join(f"{k} {v:.4g}" for k, v in phase.weights.items())
        notes.append(
            f"phases[{i}] ({phase.name}): weights sum to {given:.6g}, not 1; "
            f"normalised to {weights}"
        )
    return notes
