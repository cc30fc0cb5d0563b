"""The OpenAI and vLLM ways of asking for structured output -> one `GuidedDecodingParams`.

`to_internal` calls `guided_from_body` for both endpoints. A request may use one of:
  * OpenAI's `response_format`: `{"type": "json_schema", "json_schema": {"name", "schema",
    "strict"}}` (the schema is enforced; name and strict are accepted and not used),
    `{"type": "json_object"}` (any JSON object) or `{"type": "text"}` (no constraint);
  * vLLM's older extra fields `guided_json` (a schema as an object or JSON text), `guided_regex`,
    `guided_choice` (a list of strings), `guided_grammar` (EBNF, start rule `root`);
  * vLLM's newer `structured_outputs`: `{"json" | "regex" | "choice" | "grammar" | "json_object"}`.
More than one constraint is refused, naming the fields. Shape errors are raised here naming the
OpenAI field; whether the schema, regex or grammar compiles is decided by the engine at
admission (XGrammar, as for gRPC), and the returned `renamed` map makes that error name the
OpenAI field too (e.g. "guided.regex" -> "guided_regex").
"""

from dataclasses import dataclass

from shared.errors import InvalidRequestError
from shared.guided.params import GuidedDecodingParams

from services.gateway.http.schemas import SamplingFields

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
# vLLM's extra field -> GuidedDecodingParams field
_GUIDED_FIELDS = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
                  "guided_grammar": "grammar"}
# structured_outputs key -> GuidedDecodingParams field
_STRUCTURED_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
                    "json_object": "json_object"}
_UNSUPPORTED = {
    "guided_whitespace_pattern": "is not supported: JSON output uses fixed separators (', ' and ': ')",
    "structured_outputs.whitespace_pattern": "is not supported: JSON output uses fixed separators "
                                             "(', ' and ': ')",
    "structured_outputs.structural_tag": "is not supported by this server",
}


@dataclass(frozen=True)
class RequestedGuide:
    """One constraint as the client sent it."""

    field_name: str  # the OpenAI field, e.g. "response_format.json_schema.schema"
    kind: str  # the GuidedDecodingParams field it fills
    value: object


def guided_from_body(body: SamplingFields) -> tuple[GuidedDecodingParams | None, dict[str, str]]:
    """The request's constraint (None: unconstrained) and the renames for the engine's errors
    about it. Raises InvalidRequestError naming the OpenAI field."""
    _refuse_unsupported(body)
    guides = requested_guides(body)
    if not guides:
        return None, {}
    if len(guides) > 1:
        names = ", ".join(guide.field_name for guide in guides)
        raise InvalidRequestError(guides[1].field_name,
                                  f"only one guided-decoding constraint per request; got {names}")
    [guide] = guides
    renamed = {"guided": guide.field_name, f"guided.{guide.kind}": guide.field_name}
    try:
        return GuidedDecodingParams(**{guide.kind: guide.value}), renamed
    except InvalidRequestError as error:
        raise InvalidRequestError(renamed.get(error.field, guide.field_name), error.message) from None


def requested_guides(body: SamplingFields) -> list[RequestedGuide]:
    """Every constraint the body sets, in the order response_format, guided_*, structured_outputs."""
    guides = []
    if body.response_format is not None:
        guides += _from_response_format(body.response_format)
    for field_name, kind in _GUIDED_FIELDS.items():
        value = getattr(body, field_name)
        if value is not None:
            guides.append(RequestedGuide(field_name, kind, value))
    if body.structured_outputs is not None:
        values = body.structured_outputs.model_dump(by_alias=True)
        for key, kind in _STRUCTURED_KEYS.items():
            if values[key] is not None and values[key] is not False:
                guides.append(RequestedGuide(f"structured_outputs.{key}", kind, values[key]))
    return guides


def _from_response_format(response_format: dict) -> list[RequestedGuide]:
    kind = response_format.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise InvalidRequestError("response_format.type",
                                  f"must be one of {', '.join(RESPONSE_FORMAT_TYPES)}, got {kind!r:.80}")
    if kind == "text":
        return []
    if kind == "json_object":
        return [RequestedGuide("response_format", "json_object", True)]
    json_schema = response_format.get("json_schema")
    if not isinstance(json_schema, dict) or json_schema.get("schema") is None:
        raise InvalidRequestError("response_format.json_schema.schema",
                                  'is required with {"type": "json_schema"}')
    return [RequestedGuide("response_format.json_schema.schema", "json_schema", json_schema["schema"])]


def _refuse_unsupported(body: SamplingFields) -> None:
    values = {"guided_whitespace_pattern": body.guided_whitespace_pattern}
    if body.structured_outputs is not None:
        values["structured_outputs.whitespace_pattern"] = body.structured_outputs.whitespace_pattern
        values["structured_outputs.structural_tag"] = body.structured_outputs.structural_tag
    for field_name, value in values.items():
        if value is not None:
            raise InvalidRequestError(field_name, _UNSUPPORTED[field_name])
