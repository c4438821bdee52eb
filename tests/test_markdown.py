"""web/markdown.mjs, run in node on a stand-in DOM (tests/markdown_dom.mjs): what Markdown
becomes (tags, text, the few attributes), that hostile model text cannot become markup, a
link or an attribute it should not, and that streaming gives the same page as rendering at
once, for every prefix of an answer, with work linear in its length.

The browser half (a real answer with a code block, its Copy button):
tests_browser/test_markdown_browser.py."""
import json
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js is not installed")

# What rendered model text may contain: these elements, these attributes, hrefs of these schemes.
TAGS = {"p", "br", "em", "strong", "del", "code", "pre", "a", "h3", "h4", "h5", "h6", "hr", "blockquote",
        "ul", "ol", "li", "div", "span", "button", "table", "thead", "tbody", "tr", "th", "td"}
ATTRIBUTES = {"class", "href", "rel", "target", "type", "start", "aria-label", "data-list", "data-copied"}


def node(script: str, timeout: float = 120):
    """Run an ES module body in node with markdown.mjs's exports, the stand-in DOM and
    `render(text)` (a fresh <div> with the text rendered at once) in scope; the JSON of `out`."""
    prelude = (f'import {{ renderMarkdown, MarkdownView, parseBlocks, parseInline, safeHref }} from "{ROOT}/web/markdown.mjs";\n'
               f'import {{ Document, tree, elements, created }} from "{ROOT}/tests/markdown_dom.mjs";\n'
               "const doc = new Document();\n"
               "const render = (text) => renderMarkdown(text, doc.createElement('div'));\n")
    result = subprocess.run(["node", "--input-type=module", "-e", prelude + script + "\nconsole.log(JSON.stringify(out));"],
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def rendered(text: str):
    """The tree of `text` rendered at once, without the outer <div>: a list of children."""
    return node(f"const out = tree(render({json.dumps(text)})).slice(2);")


def walk(children):
    for child in children:
        if isinstance(child, list):
            yield child
            yield from walk(child[2:])


def text_of(children) -> str:
    return "".join(c if isinstance(c, str) else text_of(c[2:]) for c in children)


# ------------------------------------------------------------------------------ what it becomes

def test_blocks_become_their_elements():
    out = rendered("# Title\n\npara one\nline two\n\n## Sub\n\n---\n\n> quoted *x*\n")
    assert out == [["h3", {}, "Title"], ["p", {}, "para one", ["br", {}], "line two"], ["h4", {}, "Sub"],
                   ["hr", {}], ["blockquote", {}, ["p", {}, "quoted ", ["em", {}, "x"]]]]
    # a closing run of #s is not text; seven #s or none before the space is no heading
    assert rendered("### Three ###") == [["h5", {}, "Three"]]
    assert rendered("####### seven\n#tag") == [["p", {}, "####### seven", ["br", {}], "#tag"]]


def test_emphasis_code_and_strikethrough():
    out = rendered("**bold** *em* ***both*** _under_ `a <b> c` ~~gone~~ snake_case_name 2 * 3 * 4 a*b*c")
    assert out == [["p", {}, ["strong", {}, "bold"], " ", ["em", {}, "em"], " ", ["em", {}, ["strong", {}, "both"]], " ",
                    ["em", {}, "under"], " ", ["code", {}, "a <b> c"], " ", ["del", {}, "gone"],
                    " snake_case_name 2 * 3 * 4 a", ["em", {}, "b"], "c"]]
    # unmatched runs stay as written; a code span takes the first run of its own length
    assert rendered("**open and `` a ` b `` \\*not\\*") == [["p", {}, "**open and ", ["code", {}, "a ` b"], " *not*"]]
    assert rendered("`unclosed code") == [["p", {}, "`unclosed code"]]


def test_lists_ordered_unordered_nested_and_continued():
    out = rendered("- a\n- b\n  - nested\n  continued\n- c\n\n3. three\n4. four\n\n* star\n")
    assert out == [
        ["ul", {"data-list": "false-"}, ["li", {}, "a"],
         ["li", {}, ["p", {}, "b"], ["ul", {"data-list": "false-"}, ["li", {}, "nested", ["br", {}], "continued"]]],
         ["li", {}, "c"]],
        ["ol", {"data-list": "true.", "start": "3"}, ["li", {}, "three"], ["li", {}, "four"]],
        ["ul", {"data-list": "false*"}, ["li", {}, "star"]]]
    # an ordered list of one kind, items apart by blank lines, is still one list
    assert rendered("1. one\n\n2. two") == [["ol", {"data-list": "true."}, ["li", {}, "one"], ["li", {}, "two"]]]
    # "2024. was" cannot interrupt a paragraph (only 1. can), "- x" can
    assert rendered("In\n2024. was\n- x") == [["p", {}, "In", ["br", {}], "2024. was"], ["ul", {"data-list": "false-"}, ["li", {}, "x"]]]


def test_a_fenced_code_block_keeps_its_text_and_names_its_language():
    out = rendered("Look:\n```python\ndef f(x):\n    return x * 2  # *not emphasis*\n\n\n```\n~~~\n<b>tilde</b>\n~~~")
    assert out[0] == ["p", {}, "Look:"]
    block = out[1]
    assert block[:2] == ["div", {"class": "code-block"}]
    assert block[2] == ["div", {"class": "code-head"}, ["span", {"class": "code-lang"}, "python"],
                        ["button", {"class": "copy", "type": "button", "aria-label": "Copy the python code"}, "Copy"]]
    assert block[3] == ["pre", {}, ["code", {}, "def f(x):\n    return x * 2  # *not emphasis*\n\n"]]
    assert out[2][3] == ["pre", {}, ["code", {}, "<b>tilde</b>"]] and out[2][2][2] == ["span", {"class": "code-lang"}, "code"]


def test_an_unclosed_fence_runs_to_the_end_and_a_longer_fence_holds_a_shorter_one():
    assert rendered("```js\nlet a = 1;\n\n# not a heading")[0][3] == ["pre", {}, ["code", {}, "let a = 1;\n\n# not a heading"]]
    out = rendered("````md\n```\ninner\n```\n````\nafter")
    assert out[0][3] == ["pre", {}, ["code", {}, "```\ninner\n```"]] and out[1] == ["p", {}, "after"]


def test_tables_with_alignment_and_ragged_rows():
    out = rendered("Scores:\n| name | n |  c  |\n|:-----|--:|:---:|\n| a \\| b | 1 |\n| `x|y` | 2 | 3 | 4 |\nafter")
    assert out[0] == ["p", {}, "Scores:"]
    table = out[1][2]
    assert table[2] == ["thead", {}, ["tr", {}, ["th", {"class": "align-left"}, "name"], ["th", {"class": "align-right"}, "n"],
                                      ["th", {"class": "align-center"}, "c"]]]
    rows = table[3][2:]
    assert rows[0] == ["tr", {}, ["td", {"class": "align-left"}, "a | b"], ["td", {"class": "align-right"}, "1"],
                       ["td", {"class": "align-center"}]]          # a short row is padded, a long one cut
    assert len(rows[1]) == 2 + 3 and rows[1][2][2] == "`x"              # GitHub splits on | inside code too
    assert rows[2] == ["tr", {}, ["td", {"class": "align-left"}, "after"], ["td", {"class": "align-right"}],
                       ["td", {"class": "align-center"}]]


def test_links_http_and_https_only():
    out = rendered("[site](https://example.org/a?b=1 \"title\") <http://example.com/x> see https://ex.org/w_(x)."
                   " ![logo](https://ex.org/l.png) [rel](/local) [mail](mailto:a@b.c)")
    links = [n for n in walk(out[0][2:]) if n[0] == "a"]
    assert [(a[1]["href"], text_of(a[2:])) for a in links] == [
        ("https://example.org/a?b=1", "site"), ("http://example.com/x", "http://example.com/x"),
        ("https://ex.org/w_(x)", "https://ex.org/w_(x)"), ("https://ex.org/l.png", "logo")]
    assert all(a[1]["rel"] == "noopener noreferrer" and a[1]["target"] == "_blank" for a in links)
    assert text_of(out[0][2:]).endswith(". logo [rel](/local) [mail](mailto:a@b.c)")   # refused: shown as written


# ------------------------------------------------------------------------------ hostile text

HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "<a href=\"javascript:alert(1)\">x</a>",
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](java\tscript:alert(1))",
    "[click](\x01javascript:alert(1))",
    "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "[click](vbscript:msgbox(1))",
    "[x](https://ok.example/\"onmouseover=\"alert(1))",
    "![x](javascript:alert(1))",
    "<javascript:alert(1)>",
    "[a](<javascript:alert(1)>)",
    "```\"><script>alert(1)</script>\n<img src=x onerror=alert(1)>\n```",
    "```html onload=alert(1)\n<svg/onload=alert(1)>",
    "| <b>h</b> | <i>i</i> |\n|---|---|\n| <iframe src=javascript:alert(1)> | x |",
    "# <style>*{display:none}</style>\n> <object data=x>\n- <form action=javascript:alert(1)><button>go",
    "**<svg onload=alert(1)>** `</code><script>x</script>` [**<b>x</b>**](https://ok.example)",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_model_text_stays_text(text):
    """Every element is one of the renderer's own, every attribute one it sets, every href an
    absolute http(s) URL; the HTML the model wrote is there as characters, all of them."""
    out = node("""
      const root = render(%s);
      const els = elements(root);
      out = { tags: [...new Set(els.map((e) => e.tagName.toLowerCase()))],
              attrs: [...new Set(els.flatMap((e) => [...Object.keys(e.attributes), ...Object.keys(e.dataset).map((k) => "data-" + k)]))],
              hrefs: els.filter((e) => e.tagName === "A").map((e) => e.href),
              text: root.textContent, buttons: els.filter((e) => e.tagName === "BUTTON" && e.className !== "copy").length };
    """.replace("out =", "const out =") % json.dumps(text))
    assert set(out["tags"]) <= TAGS, out
    assert set(out["attrs"]) <= ATTRIBUTES, out
    assert all(h.startswith(("http://", "https://")) and '"' not in h for h in out["hrefs"]), out
    assert out["buttons"] == 0, out
    for markup in ("<script>", "<img src=x onerror=alert(1)>", "<svg/onload=alert(1)>", "<iframe", "<style>", "<form"):
        if markup in text:
            assert markup in out["text"], (markup, out["text"])


def test_a_code_blocks_copy_button_copies_its_text():
    out = node("""
      const root = render("```sh\\necho '<b>' && rm -rf /tmp/x\\n```");
      const button = elements(root).find((e) => e.tagName === "BUTTON");
      button.click();
      await new Promise((r) => setTimeout(r, 0));
      const out = { copied: doc.copied, label: button.textContent, state: button.dataset.copied };
    """)
    assert out == {"copied": ["echo '<b>' && rm -rf /tmp/x"], "label": "Copied", "state": "true"}


# ------------------------------------------------------------------------------ streaming

STREAMED = [
    "# Plan\n\nFirst **bold\ntext** and `co\nde`.\n\n- one\n- two\n  - deep\n\n  more of two\n- three\n\n1. a\n2. b\n",
    "Code:\n\n```python\nfor i in range(3):\n    print(i)\n``\n```\nAfter the *code*.\n\n~~~\nunclosed tilde\n",
    "| a | b |\n|---|:-:|\n| 1 | 2 |\n| 3 | 4 |\n\n> q1\n> q2\n\n---\nend ```not a fence``` [l](https://e.org)\n",
    "Intro\n| x | y |\n|---|---|\n| 1 | 2 |\n* item\n\n\n   ```\n   indented fence\n  less\n   ```\n",
]


@pytest.mark.parametrize("text", STREAMED, ids=range(len(STREAMED)))
def test_streaming_shows_what_rendering_at_once_shows_at_every_prefix(text):
    """The view fed the answer one character at a time shows, after every update, exactly the
    page that rendering that prefix at once gives; and after finish(), the whole answer's."""
    out = node("""
      const text = %s;
      const root = doc.createElement("div");
      const view = new MarkdownView(root);
      const differ = [];
      for (let n = 1; n <= text.length; n += 1) {
        view.append(text[n - 1]);
        const streamed = JSON.stringify(tree(root));
        const once = JSON.stringify(tree(render(text.slice(0, n))));
        if (streamed !== once) differ.push({ prefix: text.slice(0, n), streamed, once });
      }
      view.finish();
      const out = { differ: differ.slice(0, 3), count: differ.length,
                    final: JSON.stringify(tree(root)) === JSON.stringify(tree(render(text))) };
    """ % json.dumps(text))
    assert out["count"] == 0, out["differ"]
    assert out["final"]


def test_a_long_answer_streams_with_work_linear_in_its_length():
    """10,000 lines (paragraphs, a 2,000-item list, a 5,000-line code block, a table), streamed
    in pieces of 1 to 9 characters: the same page as rendering at once, and the lines parsed
    and the nodes created grow with the text, not with its square. (A table is rendered again
    whole while it grows: its rows are not blocks of their own. 60 rows here.)"""
    out = node("""
      const parts = [];
      for (let i = 0; i < 1500; i += 1) parts.push(`Paragraph ${i} with **bold** and \\`code\\` and a [link](https://e.org/${i}).`, "");
      for (let i = 0; i < 2000; i += 1) parts.push(`- item ${i} *em*`);
      parts.push("", "```js");
      for (let i = 0; i < 5000; i += 1) parts.push(`const v${i} = ${i} * 2; // <script>`);
      parts.push("```", "", "| k | v |", "|---|---|");
      for (let i = 0; i < 60; i += 1) parts.push(`| ${i} | ${i * i} |`);
      const text = parts.join("\\n");
      const lines = text.split("\\n").length;
      const once = render(text);
      const onceNodes = created.elements + created.texts;
      created.elements = created.texts = 0;
      const root = doc.createElement("div");
      const view = new MarkdownView(root);
      let n = 0, updates = 0, seed = 7;
      while (n < text.length) {
        seed = (seed * 1103515245 + 12345) % 2147483648;
        const next = Math.min(text.length, n + 1 + (seed % 9));
        view.append(text.slice(n, next));
        n = next;
        updates += 1;
      }
      view.finish();
      const out = { lines, updates, same: JSON.stringify(tree(root)) === JSON.stringify(tree(once)),
                    linesParsed: view.stats.linesParsed, nodes: created.elements + created.texts, onceNodes,
                    code: elements(root).filter((e) => e.tagName === "CODE").at(-1).textContent.split("\\n").length };
    """, timeout=600)
    print(out)
    assert out["lines"] >= 10_000 and out["same"], out
    assert out["code"] == 5000, out
    # Each update parses the open block's lines (one or two here; the table's 62 on each of
    # its ~300 updates) and each line is in a final block once: quadratic work would be
    # updates x lines, 6e8 here. Each node is made a few times (an open block is made again
    # on each update), not once per update of the whole answer.
    assert out["linesParsed"] < 4 * out["lines"] + 4 * out["updates"] + 2 * 62 * 300, out
    assert out["nodes"] < 3 * out["onceNodes"] + 12 * out["updates"], out
