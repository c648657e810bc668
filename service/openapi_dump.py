"""Print the app's OpenAPI document as sorted, indented JSON.

``make openapi`` runs ``python -m service.openapi_dump > openapi/openapi.json``; a
test fails when the checked-in file and the app disagree. The document depends on
no setting, so default settings do.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from service.app import create_app
from service.settings import Settings

__all__ = ["openapi_document", "openapi_text"]


def openapi_document() -> dict[str, Any]:
    """The app's OpenAPI document (building the app opens nothing)."""
    doc: dict[str, Any] = create_app(Settings()).openapi()
    return doc


def openapi_text() -> str:
    """The document exactly as ``openapi/openapi.json`` holds it."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(openapi_text())
