"""Custom resources validated offline against their CustomResourceDefinitions' openAPIV3Schema
(the CRDs vendored in tests/data/k8s-crds/), as an API server with strict field validation
would: types, enums, patterns, bounds, required fields, and no unknown fields. Not checked:
the CRDs' CEL rules (x-kubernetes-validations) and defaulting."""

from functools import cache
from pathlib import Path

import jsonschema
import yaml

CRD_DIR = Path(__file__).resolve().parents[1] / "data" / "k8s-crds"


@cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the strict schema of that served version."""
    schemas = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version["served"]:
                schemas[(f"{group}/{version['name']}", kind)] = strict(version["schema"]["openAPIV3Schema"])
    return schemas


def strict(schema: dict) -> dict:
    """The schema with unknown fields rejected wherever it lists an object's fields."""
    out = {key: _strict_value(key, value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _strict_value(key: str, value):
    if key in ("properties", "patternProperties"):
        return {name: strict(sub) for name, sub in value.items()}
    if key in ("items", "additionalProperties", "not") and isinstance(value, dict):
        return strict(value)
    if key in ("allOf", "anyOf", "oneOf"):
        return [strict(sub) for sub in value]
    return value


def validate_custom_resource(doc: dict) -> None:
    """Raises jsonschema.ValidationError naming the bad field, or KeyError for a kind
    without a vendored CRD."""
    key = (doc["apiVersion"], doc["kind"])
    if key not in crd_schemas():
        raise KeyError(f"no CRD in {CRD_DIR} for {key[1]} {key[0]}")
    jsonschema.Draft4Validator(crd_schemas()[key]).validate(doc)
