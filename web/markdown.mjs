// Model answers as Markdown: paragraphs, emphasis, inline code, fenced code blocks (with
// their language and a Copy button), lists, headings, quotes, rules, http(s) links and
// tables, rendered as the answer streams in.
//
// Model text is untrusted. It only ever becomes text nodes (createTextNode); the elements come
// from the fixed set this file names, and the only attributes set from model text are a
// link's href (an absolute http: or https: URL, as the URL parser reads it), an ordered list's
// start (a number) and a code block's language label (text content). Raw HTML in an answer is
// shown as the characters it is. A link to anything else (javascript:, data:, a relative
// path) is shown as the text the model wrote.
//
// Streaming (MarkdownView): the text is split into lines as it arrives; blocks that a later
// line has closed are rendered once and never touched again; only the open last block (a
// paragraph still being written, the current list item, …) is rendered again on each update.
// An open fenced code block, which can grow long, is not re-rendered at all: its new lines
// are appended to it. The work per update is the size of the open block, not of the answer.
//
// The grammar is a practical subset of CommonMark + GitHub's tables, strikethrough and bare
// links: no setext headings, no indented code blocks, no reference links, no raw HTML; a
// single newline inside a paragraph is a line break (models write poems and addresses so).
// Parsing is markdown-blocks.mjs's (lines into blocks) and markdown-inline.mjs's (a block's
// text into nodes); this file turns their output into elements, and streams.

import { closesFence, codeLine, fenceOpen, parseBlocks } from "./markdown-blocks.mjs";
import { parseInline } from "./markdown-inline.mjs";

// The parsers, for the tests and for callers that only parse (tests/test_markdown.py).
export { parseBlocks } from "./markdown-blocks.mjs";
export { parseInline, safeHref } from "./markdown-inline.mjs";

// ------------------------------------------------------------------------------ DOM

const CANNOT_GROW = new Set(["heading", "rule"]);     // blocks of one line
const HEADING_TAGS = ["h3", "h4", "h5", "h6", "h6", "h6"];   // under the page's own h1 and h2

function element(doc, tag, className = "", text = null) {
  const node = doc.createElement(tag);
  if (className) node.className = className;
  if (text !== null) node.append(doc.createTextNode(text));
  return node;
}

function appendInline(doc, parent, nodes) {
  for (const node of nodes) {
    if (typeof node === "string") parent.append(doc.createTextNode(node));
    else if (node.type === "delim") parent.append(doc.createTextNode(node.char.repeat(node.count)));
    else if (node.type === "br") parent.append(doc.createElement("br"));
    else if (node.type === "code") parent.append(element(doc, "code", "", node.text));
    else if (node.type === "link") {
      const link = doc.createElement("a");
      link.href = node.href;
      link.rel = "noopener noreferrer";
      link.target = "_blank";
      appendInline(doc, link, node.children);
      parent.append(link);
    } else {
      const tag = { em: "em", strong: "strong", del: "del" }[node.type];
      const inner = doc.createElement(tag);
      appendInline(doc, inner, node.children);
      parent.append(inner);
    }
  }
}

// Copy a code block's text: the Clipboard API where the page may use it, else a selection
// and execCommand. The button says how it went for a moment.
async function copyCode(button, code) {
  const doc = button.ownerDocument;
  let copied = false;
  try {
    await doc.defaultView.navigator.clipboard.writeText(code.textContent);
    copied = true;
  } catch {
    try {
      const range = doc.createRange();
      range.selectNodeContents(code);
      const selection = doc.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      copied = doc.execCommand("copy");
      selection.removeAllRanges();
    } catch {
      copied = false;
    }
  }
  button.textContent = copied ? "Copied" : "Copy failed";
  button.dataset.copied = String(copied);
  doc.defaultView.setTimeout(() => { button.textContent = "Copy"; }, 1500);
}

// A fenced code block: its language over the code, a Copy button, the code in <pre><code>.
// Returns [the block's element, its <code>].
function codeBlock(doc, lang) {
  const wrap = element(doc, "div", "code-block");
  const head = element(doc, "div", "code-head");
  head.append(element(doc, "span", "code-lang", lang || "code"));
  const button = element(doc, "button", "copy", "Copy");
  button.type = "button";
  button.setAttribute("aria-label", lang ? `Copy the ${lang} code` : "Copy the code");
  const pre = doc.createElement("pre");
  const code = doc.createElement("code");
  pre.append(code);
  head.append(button);
  wrap.append(head, pre);
  button.addEventListener("click", () => copyCode(button, code));
  return [wrap, code];
}

// One block as an element (an item block: its <li>).
function renderBlock(doc, block) {
  switch (block.type) {
    case "paragraph": {
      const p = doc.createElement("p");
      appendInline(doc, p, parseInline(block.text));
      return p;
    }
    case "heading": {
      const h = doc.createElement(HEADING_TAGS[block.level - 1]);
      appendInline(doc, h, parseInline(block.text));
      return h;
    }
    case "rule": return doc.createElement("hr");
    case "code": {
      const [wrap, code] = codeBlock(doc, block.lang);
      code.append(doc.createTextNode(block.code));
      return wrap;
    }
    case "quote": {
      const quote = doc.createElement("blockquote");
      appendBlocks(doc, quote, block.blocks);
      return quote;
    }
    case "item": {
      const li = doc.createElement("li");
      // an item of one paragraph holds its text directly (a tight list)
      if (block.blocks.length === 1 && block.blocks[0].type === "paragraph") appendInline(doc, li, parseInline(block.blocks[0].text));
      else appendBlocks(doc, li, block.blocks);
      return li;
    }
    case "table": return table(doc, block);
    default: throw new Error(`unknown block ${block.type}`);
  }
}

function table(doc, block) {
  const wrap = element(doc, "div", "table-wrap");
  const t = doc.createElement("table");
  const row = (cells, tag) => {
    const tr = doc.createElement("tr");
    block.head.forEach((_, n) => {          // every row has the header's number of cells
      const cell = doc.createElement(tag);
      if (block.align[n]) cell.className = `align-${block.align[n]}`;
      appendInline(doc, cell, parseInline(cells[n] ?? ""));
      tr.append(cell);
    });
    return tr;
  };
  const head = doc.createElement("thead");
  head.append(row(block.head, "th"));
  t.append(head);
  if (block.rows.length) {
    const body = doc.createElement("tbody");
    for (const cells of block.rows) body.append(row(cells, "td"));
    t.append(body);
  }
  wrap.append(t);
  return wrap;
}

// The list an item block joins: the last child of `parent` if it is a list of the item's
// kind, else a new one (appended). Returns the list element.
function listFor(doc, parent, block) {
  const last = parent.lastElementChild;
  if (last && last.dataset?.list === `${block.ordered}${block.key}`) return last;
  const list = doc.createElement(block.ordered ? "ol" : "ul");
  list.dataset.list = `${block.ordered}${block.key}`;
  if (block.ordered && block.number !== 1) list.start = block.number;
  parent.append(list);
  return list;
}

// Append the blocks' elements to `parent`; returns the nodes appended (a new list counts,
// an item added to a list already there is its <li>).
function appendBlocks(doc, parent, blocks) {
  const added = [];
  for (const block of blocks) {
    if (block.type === "item") {
      const before = parent.lastElementChild;
      const list = listFor(doc, parent, block);
      const li = renderBlock(doc, block);
      list.append(li);
      added.push(list === before ? li : list);
    } else {
      const node = renderBlock(doc, block);
      parent.append(node);
      added.push(node);
    }
  }
  return added;
}

// The whole of `text`, rendered into `parent` at once (what a finished answer shows).
export function renderMarkdown(text, parent) {
  const view = new MarkdownView(parent);
  view.append(text);
  view.finish();
  return parent;
}

// ------------------------------------------------------------------------------ streaming

export class MarkdownView {
  #doc;
  #root;
  #text = "";          // the source so far
  #lines = [];         // its complete lines (those a newline has ended)
  #partial = "";       // the line being written
  #done = 0;           // lines[0..done) are in final blocks, rendered for good
  #open = [];          // the nodes of the open blocks: replaced on every update
  #fence = null;       // the open fenced block at lines[done], appended to as it grows:
                       //   {fence, scanned (lines looked at for its closer), code, tail, shown}
  stats = { linesParsed: 0, blocksFinal: 0 };   // work done, for the tests: linear in the text

  constructor(root, doc = root.ownerDocument) {
    this.#root = root;
    this.#doc = doc;
  }

  get text() { return this.#text; }     // all of it so far

  // The next piece of the answer's text, as it streams in.
  append(piece) {
    const pieces = (this.#partial + piece).split("\n");
    this.#text += piece;
    this.#partial = pieces.pop();
    for (const line of pieces) this.#lines.push(line.endsWith("\r") ? line.slice(0, -1) : line);
    this.#render(false);
  }

  // The text is complete: its last line too, and every block is final.
  finish() {
    if (this.#partial !== "") this.#lines.push(this.#partial);
    this.#partial = "";
    this.#render(true);
  }

  #render(finished) {
    if (this.#fence && this.#growFence(finished)) return;
    const lines = this.#lines;
    const region = lines.slice(this.#done);
    this.stats.linesParsed += region.length;
    const blocks = parseBlocks(region);
    // Every block but the last is final (parseBlocks' promise); the last one too when the
    // text is finished, or when no line can add to it (a heading, a rule, a closed fence).
    const last = blocks.at(-1);
    const lastFinal = finished || !last || CANNOT_GROW.has(last.type) || (last.type === "code" && last.closed);
    const final = lastFinal ? blocks : blocks.slice(0, -1);
    this.#clearOpen();
    if (final.length) {
      appendBlocks(this.#doc, this.#root, final);
      this.stats.blocksFinal += final.length;
    }
    this.#done += lastFinal ? region.length : last.from;
    if (finished) return;
    if (!lastFinal && last.type === "code") {
      this.#startFence(fenceOpen(lines[this.#done]), last);
      return;
    }
    // the open block, with the line being written (which may start another block)
    const open = lines.slice(this.#done);
    open.push(this.#partial);
    this.stats.linesParsed += open.length;
    this.#open = appendBlocks(this.#doc, this.#root, parseBlocks(open));
  }

  #clearOpen() {
    for (const node of this.#open) node.remove();
    this.#open = [];
    this.#fence = null;
  }

  // An unclosed fence opens at lines[done]: render it once, then only append to it.
  #startFence(fence, block) {
    const [wrap, code] = codeBlock(this.#doc, block.lang);
    this.#root.append(wrap);
    this.#open = [wrap];
    const tail = this.#doc.createTextNode("");
    code.append(tail);
    this.#fence = { fence, scanned: this.#done + 1, code, tail, shown: 0 };
    this.#growFence(false);
  }

  // The open fence takes the lines that arrived; false when one of them (or, finished, the
  // end of the text) closes it: then it is rendered again as a final block by #render.
  #growFence(finished) {
    const open = this.#fence;
    const lines = this.#lines;
    for (; open.scanned < lines.length; open.scanned += 1) {
      if (closesFence(lines[open.scanned], open.fence)) return false;
    }
    if (finished) return false;
    // complete lines not yet shown go in before the tail (the line being written)
    const first = this.#done + 1 + open.shown;
    if (first < lines.length) {
      const text = lines.slice(first).map((line) => codeLine(line, open.fence.indent)).join("\n");
      open.code.insertBefore(this.#doc.createTextNode((open.shown ? "\n" : "") + text), open.tail);
      open.shown = lines.length - this.#done - 1;
    }
    // a line being written that already reads as the closing fence is not shown as code
    const partial = closesFence(this.#partial, open.fence) ? "" : codeLine(this.#partial, open.fence.indent);
    open.tail.data = open.shown && partial ? `\n${partial}` : partial;
    return true;
  }
}
