"""What a request's output must look like: one JSON schema, JSON object, regex, choice or grammar.

Front doors build a `GuidedDecodingParams` (gRPC `GuidedDecoding`, the offline API) and put it in
`SamplingParams.guided`. Construction checks the shape (exactly one kind set, right types) and
refuses a JSON schema that no value satisfies (`{"not": {}}`, `false`...:
shared.guided.unsatisfiable); whether the schema, regex or grammar is otherwise valid is
XGrammar's call, made when the engine compiles it at admission
(`shared.guided.compiler.GrammarCache`).
"""

import json
from dataclasses import dataclass

from shared.errors import InvalidRequestError
from shared.guided.unsatisfiable import why_unsatisfiable

GUIDED_KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class GuidedDecodingParams:
    # A JSON Schema, as JSON text or as a decoded dict.
    json_schema: str | dict | None = None
    # True: any JSON object.
    json_object: bool | None = None
    # A regular expression the whole output must match.
    regex: str | None = None
    # The output is exactly one of these strings.
    choice: list[str] | None = None
    # An EBNF grammar (XGrammar / GBNF dialect) whose start rule is `root`.
    grammar: str | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def kind(self) -> str:
        """The one field that is set."""
        return next(kind for kind in GUIDED_KINDS if getattr(self, kind) is not None)

    @property
    def field_name(self) -> str:
        """The field errors name, e.g. "guided.regex"."""
        return f"guided.{self.kind}"

    @property
    def text(self) -> str:
        """The constraint as text (schemas and choices as JSON); with `kind`, the cache key."""
        value = getattr(self, self.kind)
        if self.kind == "json_object":
            return ""
        if isinstance(value, str):
            return value
        return json.dumps(value, ensure_ascii=False)

    def validate(self) -> None:
        """Raise InvalidRequestError naming the field ("guided", "guided.choice", ...)."""
        kinds = [kind for kind in GUIDED_KINDS if getattr(self, kind) is not None]
        if len(kinds) != 1:
            found = ", ".join(kinds) if kinds else "none"
            raise InvalidRequestError(
                "guided", f"set exactly one of {', '.join(GUIDED_KINDS)}; got {found}")
        _CHECKS[kinds[0]](getattr(self, kinds[0]))


def _check_json_schema(schema: object) -> None:
    if isinstance(schema, dict):
        _require_json_text("guided.json_schema", schema)
    elif not isinstance(schema, str) or not schema.strip():
        raise InvalidRequestError(
            "guided.json_schema", f"must be a non-empty JSON string or a dict, got {schema!r:.80}")
    reason = why_unsatisfiable(_decoded(schema))
    if reason is not None:
        raise InvalidRequestError("guided.json_schema", f"no value satisfies this schema: {reason}")


def _decoded(schema: str | dict) -> object:
    """The schema as JSON values; text that is not JSON is left to XGrammar to refuse."""
    if isinstance(schema, dict):
        return schema
    try:
        return json.loads(schema)
    except (ValueError, RecursionError):
        return None


def _require_json_text(field: str, value: object) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as error:
        raise InvalidRequestError(field, f"must be JSON-serialisable: {error}") from None
    except RecursionError:
        raise InvalidRequestError(field, "nests too deeply") from None


def _check_json_object(value: object) -> None:
    if value is not True:
        raise InvalidRequestError("guided.json_object", f"must be true when set, got {value!r}")


def _check_nonempty_text(field: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(field, f"must be a non-empty string, got {value!r:.80}")


def _check_choice(choices: object) -> None:
    if not isinstance(choices, (list, tuple)) or not choices:
        raise InvalidRequestError("guided.choice", f"must be a non-empty list of strings, got {choices!r:.80}")
    for choice in choices:
        if not isinstance(choice, str):
            raise InvalidRequestError("guided.choice", f"must contain only strings, got {choice!r:.80}")


_CHECKS = {
    "json_schema": _check_json_schema,
    "json_object": _check_json_object,
    "regex": lambda value: _check_nonempty_text("guided.regex", value),
    "choice": _check_choice,
    "grammar": lambda value: _check_nonempty_text("guided.grammar", value),
}
