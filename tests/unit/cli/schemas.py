"""The ``--json`` documents' schemas (docs/cli/*.schema.json) and a small validator.

The validator knows the JSON Schema keywords those files use: ``type`` (one or a list),
``const``, ``enum``, ``required``, ``properties``, ``additionalProperties`` (a schema),
``items`` and ``minimum``. A keyword it does not know fails the check, so a schema cannot
claim more than is checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[3] / "docs"
SCHEMA_DIR = DOCS / "cli"
KNOWN = {"$schema", "$id", "title", "description", "type", "const", "enum", "required",
         "properties", "additionalProperties", "items", "minimum"}  # fmt: skip
TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float), "null": (type(None),),
}  # fmt: skip


def load(command: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((SCHEMA_DIR / f"{command}.schema.json").read_text())
    return doc


def _is_type(value: object, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, TYPES[name])


def errors(value: object, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Every way ``value`` breaks ``schema`` (empty: valid)."""
    unknown = set(schema) - KNOWN
    if unknown:
        return [f"{where}: the validator does not know {sorted(unknown)}"]
    found: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is_type(value, name) for name in names):
            return [f"{where}: {value!r:.80} is not {names}"]
    if "const" in schema and value != schema["const"]:
        found.append(f"{where}: {value!r:.80} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where}: {value!r:.80} is not one of {schema['enum']}")
    if "minimum" in schema and isinstance(value, int | float) and value < schema["minimum"]:
        found.append(f"{where}: {value} is below {schema['minimum']}")
    if isinstance(value, dict):
        found += _object_errors(value, schema, where)
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += errors(item, schema["items"], f"{where}[{index}]")
    return found


def _object_errors(value: dict[str, Any], schema: dict[str, Any], where: str) -> list[str]:
    found = [f"{where}: lacks {key!r}" for key in schema.get("required", []) if key not in value]
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if key in properties:
            found += errors(item, properties[key], f"{where}.{key}")
        elif isinstance(extra, dict):
            found += errors(item, extra, f"{where}.{key}")
    return found


def check(command: str, text: str) -> dict[str, Any]:
    """The document ``text`` printed, parsed and checked against its command's schema."""
    doc: dict[str, Any] = json.loads(text)
    problems = errors(doc, load(command))
    assert not problems, "\n".join(problems)
    return doc
