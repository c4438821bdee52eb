"""The schemas JSON-schema mode is tested and measured on (tests/test_json_schema.py,
bench/schema_mask.py), each with a prompt that asks for it, and `errors(instance, schema)`:
a small validator for the supported subset, written from the JSON Schema specification's
meaning of each keyword (the jsonschema package is not in this environment). It knows
nothing of the recognizer: it checks the parsed value, as a consumer of the answer would.
"""
from __future__ import annotations

import datetime
import ipaddress
import re
import uuid

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}

SCHEMAS = [
    {"name": "person", "prompt": "Give a person's name and age.", "schema": PERSON},
    {"name": "city", "prompt": "Describe Paris: its name, country and population.",
     "schema": {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                                                 "population": {"type": "number"}},
                "required": ["city", "country"], "additionalProperties": False}},
    {"name": "fruits", "prompt": "List two or three fruits.",
     "schema": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3}},
    {"name": "sentiment", "prompt": "Is 'I love this film' positive or negative?",
     "schema": {"type": "object", "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]},
                                                 "confidence": {"type": "number"}},
                "required": ["sentiment"], "additionalProperties": False}},
    {"name": "flags", "prompt": "Is the sky blue? Is grass red?",
     "schema": {"type": "object", "properties": {"sky_blue": {"type": "boolean"}, "grass_red": {"type": "boolean"},
                                                 "note": {"type": ["string", "null"]}},
                "required": ["sky_blue", "grass_red", "note"]}},
    {"name": "team", "prompt": "Make a team of two people with names and ages.",
     "schema": {"type": "object", "properties": {"team": {"type": "string"},
                                                 "members": {"type": "array", "items": PERSON, "minItems": 1,
                                                             "maxItems": 2}},
                "required": ["team", "members"], "additionalProperties": False}},
    {"name": "version", "prompt": "Report the API version.",
     "schema": {"type": "object", "properties": {"api": {"const": "v2"}, "major": {"type": "integer"},
                                                 "stable": {"type": "boolean"}},
                "required": ["api", "major", "stable"], "additionalProperties": False}},
    {"name": "point", "prompt": "Give a point in 3D as x, y, z.",
     "schema": {"type": "array", "items": {"type": "number"}, "minItems": 3, "maxItems": 3}},
    {"name": "answer", "prompt": "What is 2 + 2? Answer with a number or null if unsure.",
     "schema": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
    {"name": "colour", "prompt": "Name a primary colour.", "schema": {"enum": ["red", "green", "blue"]}},
    {"name": "nested", "prompt": "Describe a book: title and author with first and last name.",
     "schema": {"type": "object", "properties": {
         "title": {"type": "string"},
         "author": {"$ref": "#/$defs/name"}},
         "required": ["title", "author"], "additionalProperties": False,
         "$defs": {"name": {"type": "object", "properties": {"first": {"type": "string"}, "last": {"type": "string"}},
                            "required": ["first", "last"], "additionalProperties": False}}}},
    {"name": "free", "prompt": "Give a cat's name and colour.", "schema": {"type": "object"}},
    {"name": "weather", "prompt": "What is the weather in Oslo? Use celsius.",
     "schema": {"type": "object", "properties": {"location": {"type": "string"},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]},
                                                 "days": {"type": "integer"}},
                "required": ["location", "unit"], "additionalProperties": False}},
]


# Schemas with the string and integer keywords (pattern, format, minLength/maxLength,
# minimum/maximum): tests/test_schema_keywords.py answers them with SmolLM2 and
# bench/schema_mask.py measures their masks.
KEYWORD_SCHEMAS = [
    {"name": "signup", "prompt": "Sign up Ada Lovelace, born 1815-12-10, email ada@example.org, age 36.",
     "schema": {"type": "object", "properties": {
         "name": {"type": "string", "minLength": 2, "maxLength": 30},
         "born": {"type": "string", "format": "date"},
         "email": {"type": "string", "format": "email"},
         "age": {"type": "integer", "minimum": 0, "maximum": 130}},
         "required": ["name", "born", "email", "age"], "additionalProperties": False}},
    {"name": "sku", "prompt": "Give a product code like AB-1234 and a quantity from 1 to 99.",
     "schema": {"type": "object", "properties": {
         "code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{4}$"},
         "quantity": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 100}},
         "required": ["code", "quantity"], "additionalProperties": False}},
    {"name": "server", "prompt": "Describe a server: its id, IPv4 address and when it booted.",
     "schema": {"type": "object", "properties": {
         "id": {"type": "string", "format": "uuid"},
         "ip": {"type": "string", "format": "ipv4"},
         "booted": {"type": "string", "format": "date-time"},
         "alarm": {"type": "string", "format": "time"}},
         "required": ["id", "ip", "booted"], "additionalProperties": False}},
    {"name": "tags", "prompt": "Give two to four short lowercase tags for a cooking blog.",
     "schema": {"type": "array", "minItems": 2, "maxItems": 4,
                "items": {"type": "string", "pattern": "^[a-z]+(-[a-z]+)*$", "maxLength": 12}}},
    {"name": "score", "prompt": "Rate the film Casablanca from -2 to 2 and say why in a few words.",
     "schema": {"type": "object", "properties": {
         "score": {"type": "integer", "minimum": -2, "maximum": 2},
         "why": {"type": "string", "minLength": 5, "maxLength": 60},
         "model": {"const": "smollm2"}},
         "required": ["score", "why", "model"], "additionalProperties": False}},
]

# format: the forms char_pattern.FORMATS writes, checked here from their meaning (the standard
# library parses dates and times, uuid and ipaddress the rest; email: the stated simple form).
_EMAIL = re.compile(r"[A-Za-z0-9_%+-]+(\.[A-Za-z0-9_%+-]+)*@([A-Za-z0-9-]+\.)+[A-Za-z]{2,}")
_TIME = re.compile(r"\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")


def _time_ok(text: str) -> bool:
    if not _TIME.fullmatch(text):
        return False
    try:
        datetime.time.fromisoformat(text.replace("Z", "+00:00"))
        return True
    except ValueError:
        return False


def _format_ok(text: str, form: str) -> bool:
    try:
        if form == "date":
            return len(text) == 10 and datetime.date.fromisoformat(text) is not None
        if form == "time":
            return _time_ok(text)
        if form == "date-time":
            date, sep, time = text.partition("T")
            return sep == "T" and _format_ok(date, "date") and _time_ok(time)
        if form == "uuid":
            return uuid.UUID(text) is not None and [text[i] for i in (8, 13, 18, 23)] == ["-"] * 4 and len(text) == 36
        if form == "ipv4":
            return ipaddress.IPv4Address(text) is not None
        if form == "email":
            return _EMAIL.fullmatch(text) is not None
    except ValueError:
        return False
    raise AssertionError(f"the validator does not know the format {form!r}")


def errors(instance, schema, root=None, where="$") -> list[str]:
    """Every way `instance` fails `schema` (empty: valid)."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return []
    if "$ref" in schema:
        section, name = schema["$ref"][2:].split("/", 1)
        return errors(instance, root[section][name], root, where)
    if "anyOf" in schema:
        if any(not errors(instance, branch, root, where) for branch in schema["anyOf"]):
            return []
        return [f"{where}: matches no anyOf branch"]
    out = []
    if "const" in schema and not _equal(instance, schema["const"]):
        out.append(f"{where}: is not the const {schema['const']!r}")
    if "enum" in schema and not any(_equal(instance, v) for v in schema["enum"]):
        out.append(f"{where}: is not one of {schema['enum']!r}")
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_is(instance, t) for t in types):
            out.append(f"{where}: is not of type {types}")
            return out
    if isinstance(instance, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in instance:
                out.append(f"{where}: misses required {name!r}")
        for name, value in instance.items():
            if name in properties:
                out += errors(value, properties[name], root, f"{where}.{name}")
            elif schema.get("additionalProperties", True) is False:
                out.append(f"{where}: has the additional property {name!r}")
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0):
            out.append(f"{where}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(instance) > schema["maxLength"]:
            out.append(f"{where}: longer than {schema['maxLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], instance):
            out.append(f"{where}: does not match {schema['pattern']!r}")
        if "format" in schema and not _format_ok(instance, schema["format"]):
            out.append(f"{where}: is not a {schema['format']}")
    if isinstance(instance, (int, float)) and not isinstance(instance, bool):
        if "minimum" in schema and instance < schema["minimum"]:
            out.append(f"{where}: below the minimum {schema['minimum']}")
        if "maximum" in schema and instance > schema["maximum"]:
            out.append(f"{where}: above the maximum {schema['maximum']}")
        if "exclusiveMinimum" in schema and instance <= schema["exclusiveMinimum"]:
            out.append(f"{where}: not above {schema['exclusiveMinimum']}")
        if "exclusiveMaximum" in schema and instance >= schema["exclusiveMaximum"]:
            out.append(f"{where}: not below {schema['exclusiveMaximum']}")
    if isinstance(instance, list):
        if len(instance) < schema.get("minItems", 0):
            out.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(instance) > schema["maxItems"]:
            out.append(f"{where}: more than {schema['maxItems']} items")
        for i, item in enumerate(instance):
            out += errors(item, schema.get("items", {}), root, f"{where}[{i}]")
    return out


def _is(value, kind: str) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    return isinstance(value, dict)


def _equal(a, b) -> bool:
    """JSON equality: 1 == 1.0, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b
