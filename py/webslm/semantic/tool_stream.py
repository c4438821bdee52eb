"""Streamed tool calls: an answer's text, as it is committed, split into OpenAI's streaming
pieces: content deltas, and `delta.tool_calls` entries ({index, id, type: "function",
function: {name, arguments: ""}} when a call begins, then {index, function: {arguments:
fragment}}: the fragments joined are the call's arguments as JSON text).

What is streamed when (tool_calls.ToolPlan decides what a call is):

- a forced call (tool_choice "required" or a function): the answer is constrained to
  {"name": ..., "arguments": {...}} (JSON-schema mode, keys in that order), so it is a call
  from its first token: the call begins as soon as the name is read, and the arguments
  stream as the model writes them, up to the brace that closes them;
- "auto", tag format (<tool_call>...</tool_call>): text before a "<tool_call>" streams as
  content (a tail that may be the start of the tag is held back until it is ruled out); from
  the first tag on, the text is held, and at the end ToolPlan.read decides, exactly as
  without streaming: valid calls stream as tool_calls (each one's arguments in one fragment),
  the text around them as content; otherwise the held text streams as content;
- "auto", bare JSON format: an answer that begins with "{" is held to the end and decided
  the same way; any other streams as content.

Either way the final reply's `tool_calls` are the streamed ones (same ids) and the content
streamed is the reply's content (None: none).
"""
from __future__ import annotations

import hashlib
import json
import re

from .tool_calls import HERMES_OPEN, ToolPlan

_FORCED_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*', re.S)


class ToolStream:
    def __init__(self, plan: ToolPlan, salt: str):
        self.plan, self.salt = plan, salt
        self.text = ""                 # the whole answer so far
        self.shown = 0                 # how much of it has streamed as content (auto)
        self.held_from = None          # auto: where held text begins (a call may start there)
        self.forced_name = None        # forced: the call's name once read
        self.args_at = None            # forced: where the arguments begin in `text`
        self.args_sent = 0             # forced: how much of the arguments has streamed
        self.args_done = False
        self.depth, self.in_string, self.escaped = 0, False, False
        self.content: list[str] = []

    def call_id(self, index: int) -> str:
        return f"call_{hashlib.sha256(self.salt.encode('utf-8')).hexdigest()[:12]}_{index}"

    # -- as the answer commits ------------------------------------------------------------------

    def feed(self, delta: str) -> list[dict]:
        """The pieces to stream after `delta`: [{"text": ...} | {"tool_calls": [...]}]."""
        self.text += delta
        return self._forced() if self.plan.forced else self._auto()

    def _forced(self) -> list[dict]:
        out = []
        if self.forced_name is None:
            head = _FORCED_HEAD.match(self.text)
            if head is None:
                return out
            self.forced_name, self.args_at = json.loads(head.group(1)), head.end()
            out.append({"tool_calls": [{"index": 0, "id": self.call_id(0), "type": "function",
                                        "function": {"name": self.forced_name, "arguments": ""}}]})
        if not self.args_done:
            start = self.args_at + self.args_sent
            end = self._scan(start)
            if end > start:
                out.append({"tool_calls": [{"index": 0, "function": {"arguments": self.text[start:end]}}]})
                self.args_sent += end - start
        return out

    def _scan(self, start: int) -> int:
        """How far the arguments' JSON text reaches from `start` (it ends at its closing brace)."""
        for i in range(start, len(self.text)):
            ch = self.text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.args_done = True
                    return i + 1
            elif self.depth == 0 and not ch.isspace():
                self.args_done = True       # not an object: the schema would not allow it
                return i
        return len(self.text)

    def _auto(self) -> list[dict]:
        if self.held_from is not None:
            return []
        if self.plan.format == "hermes":
            at = self.text.find(HERMES_OPEN, self.shown)
            if at >= 0:
                self.held_from = at
                return self._show(at)
            return self._show(len(self.text) - _partial_suffix(self.text, HERMES_OPEN))
        if self.text.lstrip():                       # bare JSON: a call is the whole answer
            if self.text.lstrip().startswith("{"):
                self.held_from = 0
                return []
            return self._show(len(self.text))
        return []

    def _show(self, end: int) -> list[dict]:
        if end <= self.shown:
            return []
        piece = self.text[self.shown:end]
        self.shown = end
        self.content.append(piece)
        return [{"text": piece}]

    # -- at the end -----------------------------------------------------------------------------

    def end(self, finish_reason: str) -> tuple[list[dict], list[dict] | None, str | None]:
        """(the last pieces to stream, the reply's tool_calls or None, the reply's content)."""
        read = self.plan.read(self.text, salt=self.salt) if finish_reason == "stop" else None
        if self.plan.forced:
            if read is None:                         # cut short (max_tokens, abort): no call
                return [], None, self.text
            content, calls = read
            calls = [{**call, "id": self.call_id(i)} for i, call in enumerate(calls)]
            return [], calls, content
        if read is None or self.held_from is None:
            out = self._show(len(self.text))
            return out, None, self.text
        content, calls = read
        calls = [{**call, "id": self.call_id(i)} for i, call in enumerate(calls)]
        out = []
        held_content = _strip_calls(self.text[self.held_from:], self.plan.format)
        if held_content:
            out += self._show_text(held_content)
        for i, call in enumerate(calls):
            out.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                        "function": {"name": call["function"]["name"], "arguments": ""}}]})
            out.append({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]})
        return out, calls, content

    def _show_text(self, text: str) -> list[dict]:
        self.content.append(text)
        return [{"text": text}]


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


def _strip_calls(held: str, fmt: str) -> str:
    """The held text without its call blocks (what ToolPlan.read keeps as content of it)."""
    if fmt != "hermes":
        return ""
    from .tool_calls import HERMES_CLOSE
    pattern = re.escape(HERMES_OPEN) + r".*?(?:" + re.escape(HERMES_CLOSE) + r"|$)"
    return re.sub(pattern, "", held, flags=re.S).strip()
