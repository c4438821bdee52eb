"""Parser (Jinja's grammar for the subset): tokens -> tree of Node. Constructs outside the
subset, unknown filters/tests and too-deep nesting are rejected here, with line/column."""
from __future__ import annotations

from typing import Callable

from .errors import Limits, TemplateLimitError, TemplateSecurityError, TemplateSyntaxError
from .lexer import Source, Token


class Node:
    __slots__ = ("kind", "pos", "args")

    def __init__(self, kind: str, pos: int, *args):
        self.kind = kind
        self.pos = pos
        self.args = args


_COMPARE_OPS = {"eq": "==", "ne": "!=", "lt": "<", "lteq": "<=", "gt": ">", "gteq": ">="}
_REJECTED_TAGS = {"macro", "call", "filter", "include", "import", "from", "extends", "block",
                  "with", "do", "autoescape", "endmacro", "endcall", "endfilter", "endblock",
                  "endwith", "endautoescape", "trans", "pluralize", "endtrans"}
_RESERVED_NAMES = {"true", "false", "none", "True", "False", "None"}


class Parser:
    def __init__(self, src: Source, tokens: list[Token], filters: dict, tests: dict, limits: Limits):
        self.src = src
        self.tokens = tokens
        self.i = 0
        self.filters = filters
        self.tests = tests
        self.limits = limits
        self.depth = 0
        self.loop_depth = 0

    # -- token stream helpers
    @property
    def cur(self) -> Token:
        return self.tokens[self.i]

    def look(self) -> Token:
        return self.tokens[min(self.i + 1, len(self.tokens) - 1)]

    def next(self) -> Token:
        token = self.tokens[self.i]
        if token.type != "eof":
            self.i += 1
        return token

    def is_name(self, value: str, token: Token | None = None) -> bool:
        token = token or self.cur
        return token.type == "name" and token.value == value

    def skip_name(self, value: str) -> bool:
        if self.is_name(value):
            self.i += 1
            return True
        return False

    def fail(self, message: str, token: Token | None = None, construct: str | None = None,
             cls=TemplateSyntaxError):
        return self.src.error(cls, message, (token or self.cur).pos, construct)

    def expect(self, type_: str, value: str | None = None) -> Token:
        token = self.cur
        if token.type != type_ or (value is not None and token.value != value):
            wanted = value or type_
            got = "end of template" if token.type == "eof" else (token.value or token.type)
            raise self.fail(f"expected {wanted!r}, got {got!r}", token, wanted)
        return self.next()

    def enter(self, token: Token):
        self.depth += 1
        if self.depth > self.limits.max_nesting:
            raise self.fail("template nesting is too deep", token, "nesting", TemplateLimitError)

    # -- template structure
    def parse(self) -> list[Node]:
        body = self.subparse(())
        if self.cur.type != "eof":
            raise self.fail(f"unexpected tag {self.cur.value!r}", self.cur, str(self.cur.value))
        return body

    def subparse(self, end_names: tuple[str, ...]) -> list[Node]:
        """Statements up to (not including) a block tag whose name is in end_names."""
        body: list[Node] = []
        while True:
            token = self.cur
            if token.type == "eof":
                if end_names:
                    closer = next((n for n in end_names if n.startswith("end")), end_names[0])
                    raise self.fail(f"unexpected end of template, expected {' or '.join(end_names)}",
                                    token, closer)
                return body
            if token.type == "data":
                self.next()
                body.append(Node("data", token.pos, token.value))
            elif token.type == "variable_begin":
                self.next()
                expr = self.parse_tuple()
                self.expect("variable_end")
                body.append(Node("output", token.pos, expr))
            else:  # block_begin
                self.next()
                if self.cur.type == "name" and self.cur.value in end_names:
                    return body
                body.append(self.parse_statement())
                self.expect("block_end")

    def parse_statements(self, end_names: tuple[str, ...], drop_needle: bool) -> list[Node]:
        self.expect("block_end")
        self.enter(self.cur)
        body = self.subparse(end_names)
        self.depth -= 1
        if drop_needle:
            self.next()
        return body

    def parse_statement(self) -> Node:
        token = self.cur
        if token.type != "name":
            raise self.fail("tag name expected", token, "block")
        name = token.value
        if name == "if":
            return self.parse_if()
        if name == "for":
            return self.parse_for()
        if name == "set":
            return self.parse_set()
        if name in ("break", "continue"):
            if not self.loop_depth:
                raise self.fail(f"'{name}' outside of a loop", token, name)
            self.next()
            return Node(name, token.pos)
        if name == "print":
            self.next()
            return Node("output", token.pos, self.parse_tuple())
        if name == "generation":  # transformers' AssistantTracker tag: renders its body as is
            self.next()
            return Node("scope", token.pos, self.parse_statements(("endgeneration",), True))
        if name in _REJECTED_TAGS:
            raise self.fail(f"'{name}' tags are not supported by this template evaluator", token, name)
        raise self.fail(f"unknown tag {name!r}", token, name)

    def parse_if(self) -> Node:
        token = self.next()
        branches = []
        else_body: list[Node] = []
        test = self.parse_tuple(with_condexpr=False)
        while True:
            body = self.parse_statements(("elif", "else", "endif"), False)
            branches.append((test, body))
            tag = self.next()
            if tag.value == "elif":
                test = self.parse_tuple(with_condexpr=False)
                continue
            if tag.value == "else":
                else_body = self.parse_statements(("endif",), True)
            return Node("if", token.pos, branches, else_body)

    def parse_for(self) -> Node:
        token = self.next()
        target = self.parse_assign_target(extra_end=("in",))
        self.expect("name", "in")
        iterable = self.parse_tuple(with_condexpr=False, extra_end=("recursive",))
        test = self.parse_expression() if self.skip_name("if") else None
        if self.is_name("recursive"):
            raise self.fail("recursive loops are not supported", self.cur, "recursive")
        self.loop_depth += 1
        body = self.parse_statements(("endfor", "else"), False)
        self.loop_depth -= 1
        else_body = [] if self.next().value == "endfor" else self.parse_statements(("endfor",), True)
        return Node("for", token.pos, target, iterable, test, body, else_body)

    def parse_set(self) -> Node:
        token = self.next()
        target = self.parse_assign_target(namespace_ok=True)
        if self.cur.type == "assign":
            self.next()
            return Node("set", token.pos, target, self.parse_tuple())
        if self.cur.type == "pipe":
            raise self.fail("filtered block set is not supported", self.cur, "set")
        body = self.parse_statements(("endset",), True)
        return Node("setblock", token.pos, target, body)

    def parse_assign_target(self, extra_end: tuple[str, ...] = (), namespace_ok: bool = False) -> Node:
        token = self.cur
        if namespace_ok and token.type == "name" and self.look().type == "dot":
            self.next()
            self.next()
            attr = self.expect("name")
            return Node("nsref", token.pos, token.value, attr.value)
        target = self.parse_tuple(simplified=True, extra_end=extra_end)
        names = target.args[0] if target.kind == "tuple" else [target]
        for node in names:
            if node.kind != "name" or node.args[0] in _RESERVED_NAMES:
                raise self.fail("can't assign to this target", token, "assignment")
        return target

    # -- expressions
    def parse_tuple(self, simplified=False, with_condexpr=True, extra_end: tuple[str, ...] = (),
                    explicit_parentheses=False) -> Node:
        token = self.cur
        items = []
        is_tuple = False
        while True:
            if items:
                self.expect("comma")
            if self.cur.type in ("variable_end", "block_end", "rparen") or \
                    (self.cur.type == "name" and self.cur.value in extra_end):
                break
            if simplified:
                items.append(self.parse_primary())
            else:
                items.append(self.parse_expression(with_condexpr))
            if self.cur.type == "comma":
                is_tuple = True
            else:
                break
        if not is_tuple:
            if items:
                return items[0]
            if not explicit_parentheses:
                raise self.fail("expected an expression", self.cur, "expression")
        return Node("tuple", token.pos, items)

    def parse_expression(self, with_condexpr: bool = True) -> Node:
        token = self.cur
        self.enter(token)
        node = self.parse_condexpr() if with_condexpr else self.parse_or()
        self.depth -= 1
        return node

    def parse_condexpr(self) -> Node:
        expr1 = self.parse_or()
        while self.is_name("if"):
            token = self.next()
            expr2 = self.parse_or()
            expr3 = self.parse_condexpr() if self.skip_name("else") else None
            expr1 = Node("condexpr", token.pos, expr2, expr1, expr3)
        return expr1

    def parse_or(self) -> Node:
        left = self.parse_and()
        while self.is_name("or"):
            token = self.next()
            left = Node("or", token.pos, left, self.parse_and())
        return left

    def parse_and(self) -> Node:
        left = self.parse_not()
        while self.is_name("and"):
            token = self.next()
            left = Node("and", token.pos, left, self.parse_not())
        return left

    def parse_not(self) -> Node:
        if self.is_name("not"):
            token = self.next()
            self.enter(token)
            node = Node("not", token.pos, self.parse_not())
            self.depth -= 1
            return node
        return self.parse_compare()

    def parse_compare(self) -> Node:
        token = self.cur
        expr = self.parse_math1()
        ops = []
        while True:
            if self.cur.type in _COMPARE_OPS:
                op = _COMPARE_OPS[self.next().type]
            elif self.skip_name("in"):
                op = "in"
            elif self.is_name("not") and self.is_name("in", self.look()):
                self.i += 2
                op = "not in"
            else:
                break
            ops.append((op, self.parse_math1()))
        return Node("compare", token.pos, expr, ops) if ops else expr

    def _binary_chain(self, operand: Callable[[], Node], ops: dict[str, str]) -> Node:
        left = operand()
        while self.cur.type in ops:
            token = self.next()
            left = Node("binop", token.pos, ops[token.type], left, operand())
        return left

    def parse_math1(self) -> Node:
        return self._binary_chain(self.parse_concat, {"add": "+", "sub": "-"})

    def parse_concat(self) -> Node:
        token = self.cur
        args = [self.parse_math2()]
        while self.cur.type == "tilde":
            self.next()
            args.append(self.parse_math2())
        return args[0] if len(args) == 1 else Node("concat", token.pos, args)

    def parse_math2(self) -> Node:
        return self._binary_chain(self.parse_pow, {"mul": "*", "div": "/", "floordiv": "//", "mod": "%"})

    def parse_pow(self) -> Node:  # left-associative in Jinja: 2**3**2 == 64
        return self._binary_chain(self.parse_unary, {"pow": "**"})

    def parse_unary(self, with_filter: bool = True) -> Node:
        token = self.cur
        self.enter(token)
        if token.type in ("sub", "add"):
            self.next()
            node = Node("neg" if token.type == "sub" else "pos", token.pos, self.parse_unary(False))
        else:
            node = self.parse_primary()
        node = self.parse_postfix(node)
        if with_filter:
            node = self.parse_filter_expr(node)
        self.depth -= 1
        return node

    def parse_primary(self) -> Node:
        token = self.cur
        if token.type == "name":
            self.next()
            if token.value in ("true", "True", "false", "False"):
                return Node("const", token.pos, token.value in ("true", "True"))
            if token.value in ("none", "None"):
                return Node("const", token.pos, None)
            return Node("name", token.pos, token.value)
        if token.type == "string":
            self.next()
            parts = [token.value]
            while self.cur.type == "string":  # adjacent literals concatenate
                parts.append(self.next().value)
            return Node("const", token.pos, "".join(parts))
        if token.type in ("integer", "float"):
            self.next()
            return Node("const", token.pos, token.value)
        if token.type == "lparen":
            self.next()
            node = self.parse_tuple(explicit_parentheses=True)
            self.expect("rparen")
            return node
        if token.type == "lbracket":
            return self.parse_list()
        if token.type == "lbrace":
            return self.parse_dict()
        got = "end of template" if token.type == "eof" else (token.value or token.type)
        raise self.fail(f"unexpected {got!r}", token, str(got))

    def parse_list(self) -> Node:
        token = self.expect("lbracket")
        items = []
        while self.cur.type != "rbracket":
            if items:
                self.expect("comma")
            if self.cur.type == "rbracket":
                break
            items.append(self.parse_expression())
        self.expect("rbracket")
        return Node("list", token.pos, items)

    def parse_dict(self) -> Node:
        token = self.expect("lbrace")
        items = []
        while self.cur.type != "rbrace":
            if items:
                self.expect("comma")
            if self.cur.type == "rbrace":
                break
            key = self.parse_expression()
            self.expect("colon")
            items.append((key, self.parse_expression()))
        self.expect("rbrace")
        return Node("dict", token.pos, items)

    def parse_postfix(self, node: Node) -> Node:
        while True:
            if self.cur.type in ("dot", "lbracket"):
                node = self.parse_subscript(node)
            elif self.cur.type == "lparen":
                node = self.parse_call(node)
            else:
                return node

    def parse_filter_expr(self, node: Node) -> Node:
        while True:
            if self.cur.type == "pipe":
                node = self.parse_filter(node)
            elif self.is_name("is"):
                node = self.parse_test(node)
            elif self.cur.type == "lparen":
                node = self.parse_call(node)
            else:
                return node

    def parse_subscript(self, node: Node) -> Node:
        token = self.next()
        if token.type == "dot":
            attr = self.next()
            if attr.type == "name":
                if attr.value.startswith("__"):
                    raise self.fail(f"access to attribute {attr.value!r} is not allowed", attr,
                                    attr.value, TemplateSecurityError)
                return Node("getattr", attr.pos, node, attr.value)
            if attr.type != "integer":
                raise self.fail("expected name or number after '.'", attr, "attribute")
            return Node("getitem", attr.pos, node, Node("const", attr.pos, attr.value))
        args = []
        while self.cur.type != "rbracket":
            if args:
                self.expect("comma")
            args.append(self.parse_subscribed())
        self.expect("rbracket")
        arg = args[0] if len(args) == 1 else Node("tuple", token.pos, args)
        return Node("getitem", token.pos, node, arg)

    def parse_subscribed(self) -> Node:
        token = self.cur
        if token.type == "colon":
            self.next()
            args = [None]
        else:
            node = self.parse_expression()
            if self.cur.type != "colon":
                return node
            self.next()
            args = [node]
        if self.cur.type == "colon":
            args.append(None)
        elif self.cur.type not in ("rbracket", "comma"):
            args.append(self.parse_expression())
        else:
            args.append(None)
        if self.cur.type == "colon":
            self.next()
            args.append(self.parse_expression() if self.cur.type not in ("rbracket", "comma") else None)
        else:
            args.append(None)
        return Node("slice", token.pos, *args)

    def parse_call_args(self) -> tuple[list[Node], list[tuple[str, Node]]]:
        self.expect("lparen")
        args: list[Node] = []
        kwargs: list[tuple[str, Node]] = []
        while self.cur.type != "rparen":
            if args or kwargs:
                self.expect("comma")
                if self.cur.type == "rparen":
                    break
            if self.cur.type in ("mul", "pow"):
                raise self.fail("*args and **kwargs in calls are not supported", self.cur, "call")
            if self.cur.type == "name" and self.look().type == "assign":
                key = self.next().value
                self.next()
                kwargs.append((key, self.parse_expression()))
            else:
                if kwargs:
                    raise self.fail("positional argument after keyword argument", self.cur, "call")
                args.append(self.parse_expression())
        self.expect("rparen")
        return args, kwargs

    def parse_call(self, node: Node) -> Node:
        token = self.cur
        args, kwargs = self.parse_call_args()
        return Node("call", token.pos, node, args, kwargs)

    def _dotted_name(self) -> Token:
        token = self.expect("name")
        name = token.value
        while self.cur.type == "dot":
            self.next()
            name += "." + self.expect("name").value
        return Token("name", name, token.pos)

    def parse_filter(self, node: Node) -> Node:
        while self.cur.type == "pipe":
            self.next()
            name = self._dotted_name()
            if name.value not in self.filters:
                raise self.fail(f"no filter named {name.value!r}", name, name.value)
            args, kwargs = self.parse_call_args() if self.cur.type == "lparen" else ([], [])
            node = Node("filter", name.pos, name.value, node, args, kwargs)
        return node

    def parse_test(self, node: Node) -> Node:
        token = self.next()  # 'is'
        negated = self.skip_name("not")
        name = self._dotted_name()
        if name.value not in self.tests:
            raise self.fail(f"no test named {name.value!r}", name, name.value)
        args, kwargs = [], []
        if self.cur.type == "lparen":
            args, kwargs = self.parse_call_args()
        elif self.cur.type in ("name", "string", "integer", "float", "lparen", "lbracket", "lbrace") \
                and not any(self.is_name(w) for w in ("else", "or", "and")):
            if self.is_name("is"):
                raise self.fail("you cannot chain multiple tests with is", self.cur, "is")
            args = [self.parse_postfix(self.parse_primary())]
        test = Node("test", name.pos, name.value, node, args, kwargs)
        return Node("not", token.pos, test) if negated else test
