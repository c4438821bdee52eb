"""JSON-schema mode: a JSON Schema compiled into a byte-level recognizer whose language is the
JSON texts that validate against it, for token_mask.GrammarMask (response_format
{"type": "json_schema"}).

The subset (anything else is refused by `compile_schema` with SchemaError
"unsupported-schema", naming the keyword and where it is, before any generation):

  type                  "object", "array", "string", "number", "integer", "boolean", "null",
                        or a list of them; no type: any JSON value (or object/array when
                        properties/items say so)
  properties, required  the object's keys, written in the order the schema declares them
                        (every required one; an optional one may be left out)
  additionalProperties  false, true or absent: only declared keys are written either way
                        (a schema value is refused). An object schema without properties
                        takes any object, unless additionalProperties is false ({} only)
  items, minItems, maxItems
  enum, const           the values written exactly as json.dumps writes them
  minLength, maxLength, pattern, format
                        strings: char_pattern.py's automaton (its regex subset; format one of
                        date, time, date-time, uuid, email, ipv4 in the forms it states; not
                        both pattern and format); lengths in characters, at most 4096
  minimum, maximum, exclusiveMinimum, exclusiveMaximum
                        integers only (held exactly, digit by digit: schema_scalars.py); on
                        "number" they are refused, as is multipleOf
  anyOf                 any branch (the recognizer follows every live branch at once)
  $ref                  "#/$defs/..." or "#/definitions/..." (not recursive)
  annotations           title, description, default, examples, $schema, $id, $comment, ...
                        are read and ignored

The recognizer is non-deterministic: a state is a frozenset of stacks (one per live way of
reading the text; anyOf and a number that may end or go on make several). A stack is a tuple
of frames, innermost last; each frame a small tuple (kind, ...). Between tokens of the JSON
text blanks are allowed, at most MAX_WHITESPACE in a run; nothing may follow the top-level
value but EOS. A state is a function of the bytes committed so far only, so the mask is the
same on the GPU and the CPU paths, after a replay and in every browser.
"""
from __future__ import annotations

import json
import math
from functools import lru_cache

from . import json_grammar as jg
from . import schema_scalars as sc
from .schema_scalars import SchemaError  # defined next to the scalar keywords; raised here too

MAX_WHITESPACE = jg.MAX_WHITESPACE
MAX_SCHEMA_CHARS = 65536     # the schema as JSON text
MAX_NODES = 2048             # compiled schema nodes ($ref inlined)
MAX_DEPTH = 32               # nested schemas
MAX_STEP_CACHE = 1 << 18     # (state, byte) -> state entries kept per grammar
MAX_ALTERNATIVES = 256       # anyOf branches that may be live at once (nested ones multiply)

ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment",
                         "deprecated", "readOnly", "writeOnly", "$defs", "definitions"})
TYPE_KEYWORDS = {
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "minItems", "maxItems"}),
    "string": frozenset({"minLength", "maxLength", "pattern", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "integer": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "boolean": frozenset(), "null": frozenset(),
}
WHITESPACE = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")


# -- compiled nodes ---------------------------------------------------------------------------------
# Node kinds (a node is a tuple, kind first; nodes refer to each other by index):
#   (ANY,)                       any JSON value (json_grammar's recognizer)
#   (ANY_OBJECT,)                any JSON object
#   (STRING,)                    any string
#   (PATTERN, automaton)         a string whose characters the CharAutomaton takes
#   (NUMBER, integer)            a number; integer: no fraction or exponent
#   (RANGE, low, high)           an integer in [low, high] (None: unbounded)
#   (LITERALS, literals)         one of a set of byte strings (enum, const, true/false, null)
#   (OBJECT, keys, values, required)   keys: the key literals ('"name"' as bytes), in order
#   (ARRAY, item, min, max)      max None: unbounded
#   (UNION, branches)
ANY, ANY_OBJECT, STRING, NUMBER, LITERALS, OBJECT, ARRAY, UNION, PATTERN, RANGE = range(10)


class _Compiler:
    def __init__(self, root: dict):
        self.root = root
        self.nodes: list[tuple] = []
        self.refs: dict[str, int] = {}
        self.resolving: set[str] = set()

    def add(self, node: tuple) -> int:
        if len(self.nodes) >= MAX_NODES:
            raise SchemaError("bad-schema", "schema", f"has more than {MAX_NODES} parts")
        self.nodes.append(node)
        return len(self.nodes) - 1

    def compile(self, schema, where: str, depth: int = 0) -> int:
        if depth > MAX_DEPTH:
            raise SchemaError("bad-schema", where, f"nests more than {MAX_DEPTH} schemas deep")
        if schema is True or schema == {}:
            return self.add((ANY,))
        if schema is False:
            raise SchemaError("bad-schema", where, "is false: no value satisfies it")
        if not isinstance(schema, dict):
            raise SchemaError("bad-schema", where, "must be an object (a JSON Schema)")
        keys = set(schema) - ANNOTATIONS
        if "$ref" in keys:
            _only(keys, {"$ref"}, where)
            return self.ref(schema["$ref"], where, depth)
        if "anyOf" in keys:
            _only(keys, {"anyOf"}, where)
            branches = schema["anyOf"]
            if not isinstance(branches, list) or not branches:
                raise SchemaError("bad-schema", f"{where}.anyOf", "must be a non-empty list of schemas")
            return self.add((UNION, tuple(self.compile(b, f"{where}.anyOf[{i}]", depth + 1)
                                          for i, b in enumerate(branches))))
        types = self.types(schema, where)
        allowed = frozenset({"type", "enum", "const"}).union(*(TYPE_KEYWORDS.get(t, ()) for t in types))
        for key in sorted(keys):
            if key not in allowed:
                raise SchemaError("unsupported-schema", f"{where}.{key}",
                                  f"the keyword {key!r} is not supported here (supported: type, properties, "
                                  "required, additionalProperties, items, minItems, maxItems, enum, const, "
                                  "anyOf, $ref, minLength, maxLength, pattern, format; minimum, maximum, "
                                  "exclusiveMinimum, exclusiveMaximum on integers)")
        if "enum" in keys or "const" in keys:
            _only(keys, {"type", "enum", "const"}, where)
            return self.literals(schema, types, where)
        made = [self.typed(t, schema, where, depth) for t in types]
        return made[0] if len(made) == 1 else self.add((UNION, tuple(made)))

    def types(self, schema: dict, where: str) -> list[str]:
        given = schema.get("type")
        if given is None:
            if "properties" in schema or "additionalProperties" in schema:
                return ["object"]
            if "items" in schema or "minItems" in schema or "maxItems" in schema:
                return ["array"]
            return ["any"] if not ({"enum", "const"} & set(schema)) else list(TYPE_KEYWORDS)
        types = [given] if isinstance(given, str) else given
        if (not isinstance(types, list) or not types or len(set(map(str, types))) != len(types)
                or not all(isinstance(t, str) and t in TYPE_KEYWORDS for t in types)):
            raise SchemaError("bad-schema", f"{where}.type", f"must be one of {', '.join(TYPE_KEYWORDS)} "
                                                             "or a list of distinct ones")
        if "number" in types and "integer" in types:
            types = [t for t in types if t != "integer"]           # every integer is a number
        return types

    def typed(self, kind: str, schema: dict, where: str, depth: int) -> int:
        if kind == "any":
            return self.add((ANY,))
        if kind == "string":
            return self.string(schema, where)
        if kind in ("number", "integer"):
            return self.number(kind, schema, where)
        if kind == "boolean":
            return self.add((LITERALS, frozenset({b"true", b"false"})))
        if kind == "null":
            return self.add((LITERALS, frozenset({b"null"})))
        if kind == "array":
            return self.array(schema, where, depth)
        return self.object(schema, where, depth)

    def string(self, schema: dict, where: str) -> int:
        automaton = sc.string_automaton(schema, where)
        return self.add((STRING,) if automaton is None else (PATTERN, automaton))

    def number(self, kind: str, schema: dict, where: str) -> int:
        bounds = sc.integer_bounds(kind, schema, where)
        return self.add((NUMBER, kind == "integer") if bounds is None else (RANGE, *bounds))

    def object(self, schema: dict, where: str, depth: int) -> int:
        extra = schema.get("additionalProperties", True)
        if not isinstance(extra, bool):
            raise SchemaError("unsupported-schema", f"{where}.additionalProperties",
                              "additionalProperties as a schema is not supported (give false or true)")
        properties = schema.get("properties")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required) \
                or len(set(required)) != len(required):
            raise SchemaError("bad-schema", f"{where}.required", "must be a list of distinct property names")
        if properties is None:
            if required:
                raise SchemaError("bad-schema", f"{where}.required", "names properties the schema does not declare")
            return self.add((ANY_OBJECT,)) if extra else self.add((OBJECT, (), (), ()))
        if not isinstance(properties, dict):
            raise SchemaError("bad-schema", f"{where}.properties", "must be an object of schemas")
        missing = [r for r in required if r not in properties]
        if missing:
            raise SchemaError("bad-schema", f"{where}.required", f"names {missing[0]!r}, which is not in properties "
                                                                 "(only declared properties are written)")
        names = list(properties)
        values = tuple(self.compile(properties[n], f"{where}.properties.{n}", depth + 1) for n in names)
        keys = tuple(json.dumps(n, ensure_ascii=False).encode("utf-8") for n in names)
        return self.add((OBJECT, keys, values, tuple(n in required for n in names)))

    def array(self, schema: dict, where: str, depth: int) -> int:
        low, high = sc.count(schema, "minItems", 0, where), sc.count(schema, "maxItems", None, where)
        if high is not None and low > high:
            raise SchemaError("bad-schema", f"{where}.minItems", f"{low} is more than maxItems {high}")
        items = schema.get("items", True)
        if isinstance(items, list):
            raise SchemaError("unsupported-schema", f"{where}.items", "items as a list of schemas (a tuple) is not supported")
        item = self.compile(items, f"{where}.items", depth + 1)
        return self.add((ARRAY, item, low, high))

    def literals(self, schema: dict, types: list[str], where: str) -> int:
        if "enum" in schema and "const" in schema:
            raise SchemaError("bad-schema", where, "give enum or const, not both")
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError("bad-schema", f"{where}.enum", "must be a non-empty list")
        literals = set()
        for value in values:
            if _type_of(value) in types or (_type_of(value) == "integer" and "number" in types):
                try:
                    literals.add(json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8"))
                except ValueError:
                    raise SchemaError("bad-schema", f"{where}.enum", "holds a value JSON cannot write") from None
        if not literals:
            raise SchemaError("bad-schema", f"{where}.enum", "no value has the schema's type")
        return self.add((LITERALS, frozenset(literals)))

    def ref(self, ref, where: str, depth: int) -> int:
        if not isinstance(ref, str) or not ref.startswith(("#/$defs/", "#/definitions/")):
            raise SchemaError("unsupported-schema", f"{where}.$ref", "$ref: only local references #/$defs/NAME "
                                                                    "or #/definitions/NAME are supported")
        if ref in self.refs:
            return self.refs[ref]
        if ref in self.resolving:
            raise SchemaError("unsupported-schema", f"{where}.$ref", f"$ref {ref} refers to itself (a "
                                                                    "recursive schema): not supported")
        section, name = ref[2:].split("/", 1)
        target = (self.root.get(section) or {}).get(name.replace("~1", "/").replace("~0", "~"))
        if target is None:
            raise SchemaError("bad-schema", f"{where}.$ref", f"{ref} is not defined in the schema")
        self.resolving.add(ref)
        self.refs[ref] = node = self.compile(target, "schema." + ref[2:].replace("/", "."), depth + 1)
        self.resolving.discard(ref)
        return node


def _only(keys: set, allowed: set, where: str) -> None:
    for key in sorted(keys - allowed):
        raise SchemaError("unsupported-schema", f"{where}.{key}",
                          f"{key!r} next to {'/'.join(sorted(allowed))} is not supported")


def _type_of(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if math.isfinite(value) and value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def canonical_schema(schema) -> str:
    """The schema as compact JSON text (its keys in their given order: the order properties
    are written in): what SamplerSettings keeps and hashes. A string is parsed first
    (WebLLM's {type: "json_object", schema: "<JSON text>"})."""
    if isinstance(schema, str):
        if len(schema) > MAX_SCHEMA_CHARS:
            raise SchemaError("bad-schema", "schema", f"is longer than {MAX_SCHEMA_CHARS} characters")
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise SchemaError("bad-schema", "schema", f"is not JSON text ({exc})"[:200]) from None
    try:
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise SchemaError("bad-schema", "schema", "must be JSON data (objects, lists, strings, numbers)") from None
    if len(text) > MAX_SCHEMA_CHARS:
        raise SchemaError("bad-schema", "schema", f"is longer than {MAX_SCHEMA_CHARS} characters as JSON")
    compile_schema(text)
    return text


@lru_cache(maxsize=64)
def compile_schema(text: str) -> "SchemaGrammar":
    """The recognizer for a schema given as canonical JSON text (SchemaError if outside the subset)."""
    schema = json.loads(text)
    compiler = _Compiler(schema if isinstance(schema, dict) else {})
    root = compiler.compile(schema, "schema")
    if _alternatives(compiler.nodes, root) > MAX_ALTERNATIVES:
        raise SchemaError("bad-schema", "schema", f"its anyOf branches (nested ones multiplied) could keep more "
                                                  f"than {MAX_ALTERNATIVES} readings of one text alive")
    return SchemaGrammar(compiler.nodes, root)


def _alternatives(nodes: list[tuple], node_id: int) -> int:
    """A bound on how many stacks a value of this node may keep alive at once: the recognizer
    follows every anyOf branch that still fits, inside every branch of an enclosing one."""
    node = nodes[node_id]
    if node[0] == UNION:
        return sum(_alternatives(nodes, b) for b in node[1])
    if node[0] == OBJECT:
        return max((_alternatives(nodes, v) for v in node[2]), default=1)
    if node[0] == ARRAY:
        return _alternatives(nodes, node[1])
    return 1


# -- the recognizer ---------------------------------------------------------------------------------
# Frames (innermost last in a stack):
#   (VALUE, node, blanks)                   a value of `node` comes next (after blanks)
#   (STR, sub)                              in a string: sub 0 text, 1 after "\", 2..5 hex digits left - 1
#   (PSTR, node, state, pending)            in a PATTERN string (schema_scalars.string_step)
#   (INT, node, (negative, magnitude))      an integer of a RANGE node (schema_scalars.int_step)
#   (LIT, node, read)                       reading one of node's literals: `read` its bytes so far
#   (NUM, integer, sub)                     a number (json_grammar's NUMBER sub-states)
#   (ANYV, inner)                           any value: json_grammar's state
#   (OBJ, node, next, phase, blanks, extra) an object: next is the first property not passed;
#                                           extra the key read so far (KEY) or the property (COLON)
#   (ARR, node, count, phase, blanks)       an array: count of items (capped where it stops mattering)
VALUE, STR, LIT, NUM, ANYV, OBJ, ARR, PSTR, INT = range(9)
# object phases, and array phases (OPEN, AFTER, NEXT, INSIDE shared)
OPEN, KEY_NEXT, KEY, COLON, INSIDE, AFTER, NEXT = range(7)


class SchemaGrammar:
    """token_mask's grammar for one compiled schema (see the module docstring)."""

    def __init__(self, nodes: list[tuple], root: int):
        self.nodes = nodes
        self.initial = frozenset({((VALUE, root, 0),)})
        self._steps: dict = {}
        self._interned: dict = {}
        self._closing = None
        # per object node: the properties a key may name at each `next`, and whether "}" may come
        self._keys_from, self._closable = {}, {}
        # per literal node: every proper prefix of a literal (so a literal equal to one may go on)
        self._prefixes = {}
        for n, node in enumerate(nodes):
            if node[0] == OBJECT:
                _, keys, _, required = node
                self._keys_from[n] = [_keys_from(required, i) for i in range(len(keys) + 1)]
                self._closable[n] = [not any(required[i:]) for i in range(len(keys) + 1)]
            elif node[0] == LITERALS:
                self._prefixes[n] = frozenset(lit[:k] for lit in node[1] for k in range(len(lit)))

    # -- the token_mask interface -------------------------------------------------------------------

    def step(self, state: frozenset, byte: int) -> frozenset | None:
        key = (state, byte)
        after = self._steps.get(key, False)
        if after is False:
            out = set()
            for stack in state:
                out |= self._step(stack, byte)
            after = frozenset(out) if out else None
            if len(self._steps) >= MAX_STEP_CACHE:
                self._steps.clear()
                self._interned.clear()
            if after is not None:       # one object per state: the mask's closing() memo goes by identity
                after = self._interned.setdefault(after, after)
            self._steps[key] = after
        return after

    def accepting(self, state: frozenset) -> bool:
        return any(not stack or (len(stack) == 1 and self._may_end(stack[0])) for stack in state)

    def finished(self, state: frozenset) -> bool:
        return state == frozenset({()})

    def in_string(self, state: frozenset) -> bool:
        """Whether every stack is in a string's text: a plain byte then leaves the state as it is."""
        return all(stack and (stack[-1] == (STR, 0) or (stack[-1][0] == ANYV and stack[-1][1][1] == jg.STRING))
                   for stack in state)

    def closing(self, state: frozenset) -> float:
        """The fewest bytes that finish a valid value from `state` (closing.py states the rule)."""
        if self._closing is None:
            from .closing import SchemaClosing
            self._closing = SchemaClosing(self)
        return self._closing(state)

    def advance(self, state, data: bytes):
        for byte in data:
            state = self.step(state, byte)
            if state is None:
                return None
        return state

    # -- one stack, one byte -----------------------------------------------------------------------

    def _may_end(self, frame: tuple) -> bool:
        """Whether a value frame holds a whole value that more bytes could still extend."""
        kind = frame[0]
        if kind == NUM:
            return frame[2] in jg.NUMBER_ENDS
        if kind == LIT:
            return frame[2] in self.nodes[frame[1]][1]
        if kind == INT:
            _, low, high = self.nodes[frame[1]]
            return sc.int_may_end(low, high, frame[2])
        if kind == ANYV:
            inner = frame[1]
            return inner[1] == jg.DONE or (inner[1] == jg.NUMBER and inner[0] == "" and inner[2] in jg.NUMBER_ENDS)
        return False

    def _step(self, stack: tuple, byte: int) -> set:
        if not stack:
            return set()                          # the value is complete: only EOS follows
        frame, rest = stack[-1], stack[:-1]
        kind = frame[0]
        if kind == VALUE:
            if byte in WHITESPACE:
                return {rest + ((VALUE, frame[1], frame[2] + 1),)} if frame[2] < MAX_WHITESPACE else set()
            return self._start(rest, frame[1], byte)
        if kind == STR:
            return self._string(rest, frame[1], byte)
        if kind == PSTR:
            after = sc.string_step(self.nodes[frame[1]][1], frame[2], frame[3], byte)
            if after is None:
                return set()
            return {self._complete(rest)} if after == sc.CLOSE else {rest + ((PSTR, frame[1]) + after,)}
        out = set()
        if kind == LIT:
            read = frame[2] + bytes([byte])
            literals = self.nodes[frame[1]][1]
            if read in self._prefixes[frame[1]]:
                out.add(rest + ((LIT, frame[1], read),))
            elif read in literals:
                out.add(self._complete(rest))
        elif kind == NUM:
            sub = jg._number(frame[2], byte)
            if sub is not None and not (frame[1] and sub in (3, 5)):     # integer: no "." or "e"
                out.add(rest + ((NUM, frame[1], sub),))
        elif kind == INT:
            _, low, high = self.nodes[frame[1]]
            after = sc.int_step(low, high, frame[2], byte)
            if after is not None:
                out.add(rest + ((INT, frame[1], after),))
        elif kind == ANYV:
            inner = frame[1]
            after = jg.step(inner, byte) if inner[1] != jg.DONE else None
            if after is not None:
                out.add(self._complete(rest) if after[1] == jg.DONE else rest + ((ANYV, after),))
        elif kind == OBJ:
            return self._object(rest, frame, byte)
        elif kind == ARR:
            return self._array(rest, frame, byte)
        if self._may_end(frame):                  # the value ends here; the byte is its parent's
            out |= self._step(self._complete(rest), byte)
        return out

    def _start(self, parent: tuple, node_id: int, byte: int) -> set:
        """The stacks after `byte`, the first byte of a value of node `node_id`."""
        node = self.nodes[node_id]
        kind = node[0]
        if kind == UNION:
            out = set()
            for branch in node[1]:
                out |= self._start(parent, branch, byte)
            return out
        if kind == STRING:
            return {parent + ((STR, 0),)} if byte == ord('"') else set()
        if kind == PATTERN:
            return {parent + ((PSTR, node_id, node[1].initial, ()),)} if byte == ord('"') else set()
        if kind == RANGE:
            after = sc.int_start(node[1], node[2], byte)
            return {parent + ((INT, node_id, after),)} if after is not None else set()
        if kind == NUMBER:
            if byte == ord("-"):
                return {parent + ((NUM, node[1], 0),)}
            if byte in DIGITS:
                return {parent + ((NUM, node[1], 1 if byte == ord("0") else 2),)}
            return set()
        if kind == LITERALS:
            return self._step(parent + ((LIT, node_id, b""),), byte)
        if kind == OBJECT:
            return {parent + ((OBJ, node_id, 0, OPEN, 0, None),)} if byte == ord("{") else set()
        if kind == ARRAY:
            return {parent + ((ARR, node_id, 0, OPEN, 0),)} if byte == ord("[") else set()
        if kind == ANY_OBJECT:
            return {parent + ((ANYV, ("{", jg.KEY_OR_CLOSE, 0)),)} if byte == ord("{") else set()
        after = jg.step(("", jg.VALUE, 0), byte) if byte not in WHITESPACE else None      # ANY
        if after is None:
            return set()
        return {self._complete(parent) if after[1] == jg.DONE else parent + ((ANYV, after),)}

    def _complete(self, parent: tuple) -> tuple:
        """The stack once a value inside `parent` has ended."""
        if not parent:
            return ()
        frame, rest = parent[-1], parent[:-1]
        if frame[0] == OBJ:
            return rest + ((OBJ, frame[1], frame[2], AFTER, 0, None),)
        _, node_id, count, _, _ = frame                       # ARR
        _, _, low, high = self.nodes[node_id]
        cap = high if high is not None else low
        return rest + ((ARR, node_id, min(count + 1, cap), AFTER, 0),)

    def _string(self, rest: tuple, sub: int, byte: int) -> set:
        if sub == 0:
            if byte == ord('"'):
                return {self._complete(rest)}
            if byte == ord("\\"):
                return {rest + ((STR, 1),)}
            return {rest + ((STR, 0),)} if byte >= 0x20 else set()
        if sub == 1:
            if byte == ord("u"):
                return {rest + ((STR, 5),)}
            return {rest + ((STR, 0),)} if byte in jg.ESCAPES else set()
        if byte not in jg.HEX_DIGITS:
            return set()
        return {rest + ((STR, 0 if sub == 2 else sub - 1),)}

    def _object(self, rest: tuple, frame: tuple, byte: int) -> set:
        _, node_id, nxt, phase, blanks, extra = frame
        _, keys, values, _ = self.nodes[node_id]
        if phase in (OPEN, KEY_NEXT, COLON, AFTER) and byte in WHITESPACE:
            return {rest + ((OBJ, node_id, nxt, phase, blanks + 1, extra),)} if blanks < MAX_WHITESPACE else set()
        choices = self._keys_from[node_id][nxt]
        if phase in (OPEN, KEY_NEXT):
            if byte == ord("}") and phase == OPEN and self._closable[node_id][nxt]:
                return {self._complete(rest)}
            if byte == ord('"') and choices:
                return {rest + ((OBJ, node_id, nxt, KEY, 0, b'"'),)}
            return set()
        if phase == KEY:
            read = extra + bytes([byte])
            out = set()
            for j in choices:
                if keys[j] == read:
                    out.add(rest + ((OBJ, node_id, nxt, COLON, 0, j),))
                elif keys[j].startswith(read):
                    out.add(rest + ((OBJ, node_id, nxt, KEY, 0, read),))
            return out
        if phase == COLON:
            if byte != ord(":"):
                return set()
            return {rest + ((OBJ, node_id, extra + 1, INSIDE, 0, None), (VALUE, values[extra], 0))}
        if phase == AFTER:
            if byte == ord(",") and choices:
                return {rest + ((OBJ, node_id, nxt, KEY_NEXT, 0, None),)}
            if byte == ord("}") and self._closable[node_id][nxt]:
                return {self._complete(rest)}
        return set()

    def _array(self, rest: tuple, frame: tuple, byte: int) -> set:
        _, node_id, count, phase, blanks = frame
        _, item, low, high = self.nodes[node_id]
        if phase in (OPEN, AFTER, NEXT) and byte in WHITESPACE:
            return {rest + ((ARR, node_id, count, phase, blanks + 1),)} if blanks < MAX_WHITESPACE else set()
        if phase in (OPEN, AFTER) and byte == ord("]") and count >= low:
            return {self._complete(rest)}
        if phase == AFTER:
            if byte == ord(",") and (high is None or count < high):
                return {rest + ((ARR, node_id, count, NEXT, 0),)}
            return set()
        if phase == OPEN and high == 0:
            return set()
        return self._start(rest + ((ARR, node_id, count, INSIDE, 0),), item, byte)


def _keys_from(required: tuple, start: int) -> tuple[int, ...]:
    """The properties a key at `start` may name: each one up to and including the first
    required one (the optional ones before it may be left out)."""
    out = []
    for j in range(start, len(required)):
        out.append(j)
        if required[j]:
            break
    return tuple(out)


MAX_SCHEMA_MASKS = 8        # schemas whose masks a tokenizer keeps (the most recently used)


def schema_mask_for(tokenizer, vocab: int, eos_ids, schema_text: str):
    """The GrammarMask of a schema (canonical text) on this tokenizer, kept while among the
    MAX_SCHEMA_MASKS used last (token_mask.kept_mask)."""
    from .token_mask import kept_mask
    return kept_mask(tokenizer, "schema", schema_text, vocab, eos_ids, compile_schema, MAX_SCHEMA_MASKS)
