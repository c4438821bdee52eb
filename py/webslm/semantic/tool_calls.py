"""Function calling (OpenAI's and WebLLM's `tools` / `tool_choice`): the tools checked, rendered
through the model's own chat template, a forced call constrained by JSON-schema mode, and the
answer's calls read back into `tool_calls`.

- `check_tools(tools, tool_choice)`: the request's functions ({type: "function", function:
  {name, description, parameters}}, parameters a schema of json_schema.py's subset) and the
  choice: "auto", "none", "required" or one function's name. ToolError before any work.
- `tool_format(template)`: how this model calls a tool, found by rendering: None when its
  chat template shows no tool given to it (the model has no tool support: ToolError
  "tools-unsupported"); "hermes" when the template speaks of <tool_call> tags (Qwen2.5,
  Hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`); else "json" (a bare
  {"name": ..., "arguments" or "parameters": {...}} object, Llama 3's form).
- `ToolPlan`: what one request does with its tools. "none" does not render them (the model
  answers in text); "auto" renders them and reads any calls out of the free answer;
  "required" or a named function renders them, opens the call in the prompt as the format
  does (hermes: "<tool_call>\\n") and constrains the answer to
  {"name": <a function>, "arguments": <valid for its parameters>} (call_schema).
- `ToolPlan.read(text)`: (content, tool_calls) with tool_calls [{id, type: "function",
  function: {name, arguments: JSON text}}], or None when the answer holds no valid call.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re

from ..errors import CodedError
from .json_schema import SchemaError, canonical_schema

MAX_TOOLS = 128
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")          # OpenAI's rule for a function name
NO_PARAMETERS = {"type": "object", "properties": {}}
PROBE = "webslm_probe_tool_f3a9"                      # a name no template writes by itself
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


class ToolError(CodedError):
    """Codes: "bad-tools" (tools or tool_choice malformed), "tools-unsupported" (the model's
    chat template does not render tools), "bad-tool-schema" (a function's parameters outside
    JSON-schema mode's subset: the sentence names the keyword)."""


@dataclasses.dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: dict

    def as_tool(self) -> dict:
        """OpenAI's tool shape, as transformers hands tools to a chat template."""
        function = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


def check_tools(tools, tool_choice) -> tuple[list[Function], str]:
    """(functions, choice) of a request; choice "auto" when tools are given without one."""
    if tools is None:
        tools = []
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ToolError("bad-tools", "tools", f"must be a list of at most {MAX_TOOLS} tools")
    functions = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict) \
                or set(tool) - {"type", "function"}:
            raise ToolError("bad-tools", where, 'must be {type: "function", function: {name, description, parameters}}')
        spec = tool["function"]
        unknown = sorted(set(spec) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ToolError("bad-tools", f"{where}.function.{unknown[0]}", "is not a field of a function")
        name, description = spec.get("name"), spec.get("description") or ""
        if not isinstance(name, str) or not NAME.match(name):
            raise ToolError("bad-tools", f"{where}.function.name", "must be 1 to 64 letters, digits, _ or -")
        if any(f.name == name for f in functions):
            raise ToolError("bad-tools", f"{where}.function.name", f"{name!r} is given twice")
        if not isinstance(description, str) or len(description) > 4096:
            raise ToolError("bad-tools", f"{where}.function.description", "must be a string of at most 4096 characters")
        parameters = spec.get("parameters") or NO_PARAMETERS
        try:
            canonical_schema(parameters)
        except SchemaError as exc:
            raise ToolError("bad-tool-schema", f"{where}.function.parameters{exc.where[len('schema'):]}",
                            exc.sentence) from None
        functions.append(Function(name, description, parameters))
    return functions, _choice(tool_choice, functions)


def _choice(tool_choice, functions: list[Function]) -> str:
    if tool_choice is None:
        return "auto" if functions else "none"
    if tool_choice in ("auto", "none", "required"):
        if tool_choice != "none" and not functions:
            raise ToolError("bad-tools", "tool_choice", f'"{tool_choice}" needs tools')
        return tool_choice
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" \
            and isinstance(tool_choice.get("function"), dict) and set(tool_choice) == {"type", "function"}:
        name = tool_choice["function"].get("name")
        if any(f.name == name for f in functions):
            return name
        raise ToolError("bad-tools", "tool_choice.function.name", f"{str(name)[:64]!r} is not one of the tools")
    raise ToolError("bad-tools", "tool_choice", 'must be "auto", "none", "required" or '
                                                '{type: "function", function: {name}}')


def tool_format(template) -> str | None:
    """How a model whose chat template is `template` calls tools (module docstring), or None."""
    from .chat_template import TemplateError
    probe = Function(PROBE, "", NO_PARAMETERS).as_tool()
    try:
        shown = template.render([{"role": "user", "content": "hi"}], add_generation_prompt=True, tools=[probe])
    except TemplateError:
        return None
    if PROBE not in shown:
        return None
    return "hermes" if HERMES_OPEN in template.source else "json"


def call_schema(functions: list[Function], choice: str) -> dict:
    """The JSON schema of a call that `choice` ("required" or a name) forces."""
    def call(f: Function) -> dict:
        return {"type": "object", "properties": {"name": {"const": f.name}, "arguments": f.parameters},
                "required": ["name", "arguments"], "additionalProperties": False}
    if choice == "required":
        return {"anyOf": [call(f) for f in functions]} if len(functions) > 1 else call(functions[0])
    return call(next(f for f in functions if f.name == choice))


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """One request's tools: the functions, the choice and the model's call format."""
    functions: tuple[Function, ...]
    choice: str
    format: str

    @property
    def rendered(self) -> list[dict] | None:
        """The tools the chat template is given (None: none rendered)."""
        return None if self.choice == "none" else [f.as_tool() for f in self.functions]

    @property
    def forced(self) -> bool:
        return self.choice not in ("auto", "none")

    @property
    def prompt_suffix(self) -> str:
        """Text put after the template's generation prompt when a call is forced: the call's
        opening, as the model would write it."""
        return HERMES_OPEN + "\n" if self.forced and self.format == "hermes" else ""

    def schema(self) -> dict | None:
        return call_schema(list(self.functions), self.choice) if self.forced else None

    def read(self, text: str, salt: str = "") -> tuple[str | None, list[dict]] | None:
        """(content, tool_calls) from an answer, or None when it makes no valid call (then
        the answer is plain content). `salt` makes the call ids differ between answers."""
        if self.choice == "none":
            return None
        if self.forced:
            found = [(self._call(text), (0, len(text)))]
        elif self.format == "hermes":
            found = [(self._call(m.group(1)), m.span()) for m in
                     re.finditer(re.escape(HERMES_OPEN) + r"(.*?)(?:" + re.escape(HERMES_CLOSE) + r"|$)", text, re.S)]
        else:
            found = [(self._call(text), (0, len(text)))]
        calls = [call for call, _ in found if call is not None]
        if not calls or len(calls) != len(found):
            return None
        content = text
        for _, (start, end) in reversed(found):
            content = content[:start] + content[end:]
        content = content.strip() or None
        digest = hashlib.sha256((salt + text).encode("utf-8")).hexdigest()[:12]
        return content, [{"id": f"call_{digest}_{i}", "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
                         for i, (name, arguments) in enumerate(calls)]

    def _call(self, text: str) -> tuple[str, dict] | None:
        """(name, arguments) of one call's JSON text, if it names one of the functions."""
        try:
            value = json.loads(text.strip())
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        arguments = value.get("arguments", value.get("parameters"))
        name = value.get("name")
        if set(value) - {"name", "arguments", "parameters"} or not isinstance(arguments, dict):
            return None
        if not any(f.name == name for f in self.functions):
            return None
        return name, arguments


def tool_plan(template, tools, tool_choice) -> ToolPlan | None:
    """The request's ToolPlan (None without tools); ToolError if the model cannot take them."""
    functions, choice = check_tools(tools, tool_choice)
    if not functions:
        return None
    fmt = tool_format(template)
    if fmt is None:
        raise ToolError("tools-unsupported", "tools", "this model's chat template has no tool support (it does "
                                                      "not show tools to the model): function calling needs a "
                                                      "model whose template renders tools")
    return ToolPlan(tuple(functions), choice, fmt)
