"""JSON schemas that no value satisfies, found before anything compiles them.

XGrammar refuses some of them itself (`false`, an empty `enum`, minimum > maximum) but
ignores `not` and conflicting `allOf` members, and turns an empty `anyOf` into a grammar that
matches only the empty output: such a request would run and return nothing useful.
`why_unsatisfiable(schema)` returns the reason for the first such part it finds (with its
path inside the schema), or None. It knows these patterns, not JSON Schema's whole logic:
None means "not known to be unsatisfiable".
"""

from collections.abc import Iterator

# Keywords that describe a schema without constraining its values.
_ANNOTATIONS = frozenset({"title", "description", "$comment", "examples", "default", "$schema", "$id",
                          "deprecated", "readOnly", "writeOnly"})
_TYPES = frozenset({"null", "boolean", "object", "array", "number", "integer", "string"})
# Schemas nested deeper than this are not looked into (the engine limits nesting far lower).
MAX_DEPTH = 64


def why_unsatisfiable(schema: object, path: str = "", depth: int = 0) -> str | None:
    if depth > MAX_DEPTH:
        return None
    where = f"at {path}: " if path else ""
    if schema is False:
        return f"{where}the schema false accepts no value"
    if not isinstance(schema, dict):
        return None
    reason = _own_reason(schema)
    if reason is not None:
        return where + reason
    for sub_path, sub_schema in _required_parts(schema, path):
        reason = why_unsatisfiable(sub_schema, sub_path, depth + 1)
        if reason is not None:
            return reason
    return _anyof_reason(schema, path, depth)


def accepts_everything(schema: object) -> bool:
    return schema is True or (isinstance(schema, dict) and set(schema) <= _ANNOTATIONS)


def _own_reason(schema: dict) -> str | None:
    if "not" in schema and accepts_everything(schema["not"]):
        return f"\"not\": {_short(schema['not'])} refuses every value"
    for keyword in ("enum", "anyOf", "oneOf", "type"):
        if schema.get(keyword) == []:
            return f"\"{keyword}\": [] allows no value"
    types = _allowed_types(schema)
    if types is not None and not types:
        return "its \"type\" and the \"type\" of its \"allOf\" members have no type in common"
    return None


def _required_parts(schema: dict, path: str) -> Iterator[tuple[str, object]]:
    """The sub-schemas every valid value must also satisfy: allOf members, and the schemas
    of required properties."""
    all_of = schema.get("allOf")
    if isinstance(all_of, list):
        for index, member in enumerate(all_of):
            yield f"{path}.allOf[{index}]".lstrip("."), member
    properties = schema.get("properties")
    required = schema.get("required")
    if isinstance(properties, dict) and isinstance(required, list):
        for name in required:
            if isinstance(name, str) and name in properties:
                yield f"{path}.properties.{name}".lstrip("."), properties[name]


def _anyof_reason(schema: dict, path: str, depth: int) -> str | None:
    for keyword in ("anyOf", "oneOf"):
        members = schema.get(keyword)
        if not isinstance(members, list) or not members:
            continue
        reasons = [why_unsatisfiable(member, f"{path}.{keyword}[{index}]".lstrip("."), depth + 1)
                   for index, member in enumerate(members)]
        if all(reasons):
            return f"every member of {f'{path}.' if path else ''}{keyword} accepts no value ({reasons[0]}, ...)"
    return None


def _allowed_types(schema: dict) -> set[str] | None:
    """The JSON types a value may have by `type` here and in `allOf` members (None: any)."""
    allowed = None
    members = schema.get("allOf") if isinstance(schema.get("allOf"), list) else []
    for part in (schema, *members):
        types = _types_of(part)
        if types is not None:
            allowed = types if allowed is None else _intersect(allowed, types)
    return allowed


def _types_of(schema: object) -> set[str] | None:
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind
    if not isinstance(kinds, list) or not kinds or not set(kinds) <= _TYPES:
        return None
    return set(kinds)


def _intersect(first: set[str], second: set[str]) -> set[str]:
    """Common types; an integer is a number."""
    common = first & second
    if "number" in first and "integer" in second or "integer" in first and "number" in second:
        common.add("integer")
    return common


def _short(schema: object) -> str:
    return "{}" if schema == {} else "true" if schema is True else "a schema with no constraint"
