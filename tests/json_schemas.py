"""The schemas JSON-schema mode is tested and measured on (tests/test_json_schema.py,
bench/schema_mask.py), each with a prompt that asks for it, and `errors(instance, schema)`:
a small validator for the supported subset, written from the JSON Schema specification's
meaning of each keyword (the jsonschema package is not in this environment). It knows
nothing of the recognizer: it checks the parsed value, as a consumer of the answer would.
"""
from __future__ import annotations

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
