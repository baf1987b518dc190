"""An OpenEnv server's action, as the model writes it: its JSON schema, a prompt that says the
format, parsing a reply into the action, and the grammar for constrained decoding.

    form = ActionFormat.from_schema(schema, action_field=None, action_json=None)
    form.instructions()            # 'Reply with one JSON object: {"direction": "up" or "down", ...}'
    action, error = form.parse(reply)

Two forms, chosen from the server's `/schema` (`schema["action"]`, OpenEnv's
`model_json_schema()` of the Action class; its `metadata` field is OpenEnv's own and left out):
  * text: the reply is the value of one string field (`action_field`, or the action's only
    required field when it is a string, else a `message`/`text` field). The prompt is not
    changed; a reply is always an action.
  * json: anything else (two fields, an integer, an enum, ...; or `action_json=True`): the
    reply is one JSON object with the action's fields, also inside a ```json code fence; for an
    action with one required field a bare value ("7") is that field. The system prompt gets
    the format (every field with its type, its allowed values and its description). A reply
    that is no JSON, or does not validate against the schema, is a format error naming the
    field (`jsonschema`'s path and message) that the model reads as its next observation; the
    server never sees it.
`ActionFormat.from_schema` refuses (ValueError naming the fields) what the adapter cannot
fill: a text field that is not in the schema or is not a string, or a text form whose
action needs other fields too. `constraint()` is the json form's schema (or a text field's
allowed values) as a grammar (`environment.constrained_decoding`).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from workbench.engines.constraints import Constraint

#: Field names that take the reply text when the action has no single required string field.
TEXT_FIELDS = ("message", "text")
_FENCE = re.compile(r"```(?:json)?\s*\n?(.*?)```", re.DOTALL)


def _type_text(prop: dict[str, Any]) -> str:
    """A field's schema in words: 'one of "up", "down"', 'an integer', ..."""
    if "enum" in prop:
        return "one of " + ", ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return f"exactly {json.dumps(prop['const'])}"
    if "anyOf" in prop:
        return " or ".join(_type_text(p) for p in prop["anyOf"])
    kind = prop.get("type")
    words = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false",
             "array": "a list", "object": "an object", "null": "null"}
    if isinstance(kind, list):
        return " or ".join(words.get(k, k) for k in kind)
    text = words.get(kind, "a JSON value")
    bounds = [f">= {prop['minimum']}" if "minimum" in prop else "", f"<= {prop['maximum']}" if "maximum" in prop else ""]
    bounds = [b for b in bounds if b]
    return text + (f" ({', '.join(bounds)})" if bounds else "")


@dataclass
class ActionFormat:
    """How a reply becomes an action (see the module docstring)."""

    schema: dict[str, Any]
    """The action's JSON schema without OpenEnv's `metadata` field."""
    text_field: str | None = None
    """The text form's field, or None for the json form."""
    required: list[str] = field(default_factory=list)
    """The action's required fields."""

    @classmethod
    def from_schema(cls, action_schema: dict[str, Any], action_field: str | None = None,
                    action_json: bool | None = None) -> "ActionFormat":
        """The form for a server's action schema and the env params `action_field` / `action_json`."""
        schema = dict(action_schema)
        props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
        required = [r for r in schema.get("required") or [] if r != "metadata"]
        schema["properties"], schema["required"] = props, required
        form = cls(schema, None, required)
        if action_json:
            return form
        if action_field is None:
            strings = [r for r in required if props.get(r, {}).get("type") == "string" and "enum" not in props[r]]
            if len(required) == 1 and strings:
                action_field = required[0]
            elif not required:
                action_field = next((n for n in TEXT_FIELDS if props.get(n, {}).get("type") == "string"), None)
            if action_field is None:
                return form  # json form
        if action_field not in props:
            raise ValueError(f"environment.params.action_field={action_field!r}, but the action has no such field; "
                             f"its fields are {sorted(props)}")
        if props[action_field].get("type") != "string":
            raise ValueError(f"the action field {action_field!r} is {_type_text(props[action_field])}, not a string: "
                             "the reply text cannot fill it; leave action_field unset (the reply is then the "
                             "action's JSON)")
        others = [r for r in required if r != action_field]
        if others:
            raise ValueError(f"the action also requires {others} besides {action_field!r}: one reply text cannot fill "
                             "them; leave action_field unset (the reply is then the action's JSON)")
        form.text_field = action_field
        return form

    @property
    def is_json(self) -> bool:
        return self.text_field is None

    def instructions(self) -> str:
        """What the system prompt says about the reply's format ('' for the text form)."""
        if not self.is_json:
            return ""
        props = self.schema["properties"]
        parts = []
        for name, prop in props.items():
            need = "" if name in self.required else " (optional)"
            about = f" ({prop['description']})" if prop.get("description") else ""
            parts.append(f'"{name}": {_type_text(prop)}{need}{about}')
        example = {n: _example(props[n]) for n in props if n in self.required} or {}
        return ("Reply with one JSON object and nothing else, with the fields " + "; ".join(parts) +
                f". For example: {json.dumps(example)}")

    def parse(self, reply: str) -> tuple[dict[str, Any] | None, str | None]:
        """(the action, None), or (None, why the reply is not one: names the field)."""
        if not self.is_json:
            return {self.text_field: reply}, None
        value, error = _json_of(reply)
        if error is not None and len(self.required) == 1:
            name = self.required[0]
            return None, f"field {name!r} needs {_type_text(self.schema['properties'].get(name, {}))}: {error}"
        if error is not None:
            return None, error
        if not isinstance(value, dict):
            if len(self.required) == 1:  # a bare value fills the only required field
                value = {self.required[0]: value}
            else:
                return None, f"the reply is {type(value).__name__} JSON, not an object with the fields {self.required}"
        return value, validation_error(value, self.schema)

    def constraint(self) -> Constraint | None:
        """The reply as a grammar: the action's JSON schema, or the text field's allowed values
        (None when the text field takes any string)."""
        if self.is_json:
            return Constraint.json_schema(self.schema)
        values = self.schema["properties"][self.text_field].get("enum")
        return Constraint.choice([str(v) for v in values]) if values else None


def _example(prop: dict[str, Any]) -> Any:
    if "enum" in prop:
        return prop["enum"][0]
    return {"string": "...", "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}.get(
        prop.get("type"), None)


def _json_of(reply: str) -> tuple[Any, str | None]:
    """The JSON value of a reply (whole, or inside a code fence), or an error."""
    text = reply.strip()
    candidates = [text] + [m.group(1).strip() for m in _FENCE.finditer(reply)]
    for candidate in candidates:
        try:
            return json.loads(candidate), None
        except json.JSONDecodeError:
            continue
    return None, "the reply is not JSON (write the action as one JSON object, optionally in a ```json code fence)"


def validation_error(action: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Why `action` does not validate against `schema`, naming the field, or None."""
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(action), key=lambda e: list(e.path))
    if not errors:
        return None
    first = errors[0]
    where = ".".join(str(p) for p in first.path)
    if first.validator == "required":
        missing = re.findall(r"'([^']+)' is a required property", first.message)
        return f"field {missing[0] if missing else where!r} is missing" if missing else first.message
    if first.validator == "additionalProperties":
        return f"{first.message} (the action's fields are {sorted(schema.get('properties', {}))})"
    return f"field {where!r}: {first.message}" if where else first.message


__all__ = ["ActionFormat", "TEXT_FIELDS", "validation_error"]
