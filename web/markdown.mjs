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

// ------------------------------------------------------------------------------ blocks

const FENCE_OPEN = /^( {0,3})(`{3,}|~{3,})(.*)$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(?:([ \t]+)(.*))?$/;
const TABLE_DELIMITER = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;
const isBlank = (line) => /^[ \t]*$/.test(line);
const indentOf = (line) => line.match(/^ */)[0].length;

// The fence a line opens: {indent, char, length, lang}, or null. A backtick fence's info
// string may not hold a backtick (that line is inline code).
function fenceOpen(line) {
  const m = FENCE_OPEN.exec(line);
  if (!m || (m[2][0] === "`" && m[3].includes("`"))) return null;
  return { indent: m[1].length, char: m[2][0], length: m[2].length, lang: m[3].trim().split(/\s+/)[0] };
}

function closesFence(line, fence) {
  const m = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(line);
  return Boolean(m) && m[1][0] === fence.char && m[1].length >= fence.length;
}

// A code line without the opening fence's indentation (as far as it is spaces).
const codeLine = (line, indent) => line.slice(Math.min(indent, indentOf(line)));

// A list item marker: {indent, ordered, key, number, width (where its content starts), rest}.
function itemStart(line) {
  const m = ITEM.exec(line);
  if (!m || RULE.test(line)) return null;
  const [, indent, marker, spaces = "", rest = ""] = m;
  const ordered = /\d/.test(marker[0]);
  // more than 4 spaces after the marker: the content starts one space after it (CommonMark)
  const width = indent.length + marker.length + (spaces.length > 4 || rest === "" ? 1 : spaces.length);
  return { indent: indent.length, ordered, key: ordered ? marker.at(-1) : marker, number: ordered ? Number.parseInt(marker, 10) : null, width, rest };
}

// Split a table row into its cells: the outer pipes are optional, \| is a literal pipe.
function tableCells(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  const cells = [];
  let cell = "";
  for (let i = 0; i < row.length; i += 1) {
    if (row[i] === "\\" && row[i + 1] === "|") {
      cell += "|";
      i += 1;
    } else if (row[i] === "|") {
      cells.push(cell.trim());
      cell = "";
    } else {
      cell += row[i];
    }
  }
  cells.push(cell.trim());
  return cells;
}

// Does a table start at lines[i]: a row with a pipe, then a delimiter row of as many cells?
function tableStart(lines, i) {
  if (i + 1 >= lines.length || !lines[i].includes("|") || !TABLE_DELIMITER.test(lines[i + 1])) return false;
  return tableCells(lines[i]).length === tableCells(lines[i + 1]).length;
}

// Can lines[i] interrupt a paragraph (start a block of its own without a blank line first)?
function startsBlock(lines, i) {
  const line = lines[i];
  if (fenceOpen(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || tableStart(lines, i)) return true;
  const item = itemStart(line);
  return Boolean(item) && item.rest.trim() !== "" && (!item.ordered || item.number === 1);
}

// The blocks of `lines` (an array of strings without their newlines), in order. Each block
// is {type, from, to, ...}: lines[from..to) made it. A block ends only at a line that is
// already there (a blank line, or one that starts the next block), so every block but the
// last stays as it is whatever lines follow: MarkdownView relies on that.
export function parseBlocks(lines) {
  const blocks = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const from = i;
    if (isBlank(line)) {
      i += 1;
      continue;
    }
    const fence = fenceOpen(line);
    if (fence) {
      const code = [];
      i += 1;
      while (i < lines.length && !closesFence(lines[i], fence)) code.push(codeLine(lines[i++], fence.indent));
      const closed = i < lines.length;
      if (closed) i += 1;
      blocks.push({ type: "code", from, to: i, lang: fence.lang, code: code.join("\n"), closed });
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      // a closing run of #s is not part of the heading's text
      const text = (heading[2] ?? "").replace(/(^|[ \t]+)#+$/, "").trim();
      blocks.push({ type: "heading", from, to: i + 1, level: heading[1].length, text });
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      blocks.push({ type: "rule", from, to: i + 1 });
      i += 1;
      continue;
    }
    if (QUOTE.test(line)) {
      const inner = [];
      while (i < lines.length && QUOTE.test(lines[i])) inner.push(QUOTE.exec(lines[i++])[1]);
      blocks.push({ type: "quote", from, to: i, blocks: parseBlocks(inner) });
      continue;
    }
    const item = itemStart(line);
    if (item) {
      i = listItem(lines, i, item, blocks);
      continue;
    }
    if (tableStart(lines, i)) {
      const head = tableCells(lines[i]);
      const align = tableCells(lines[i + 1]).map((c) => (c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : c.startsWith(":") ? "left" : null));
      const rows = [];
      i += 2;
      while (i < lines.length && !isBlank(lines[i]) && !startsBlock(lines, i)) rows.push(tableCells(lines[i++]));
      blocks.push({ type: "table", from, to: i, head, align, rows });
      continue;
    }
    const text = [line.trim()];
    i += 1;
    while (i < lines.length && !isBlank(lines[i]) && !startsBlock(lines, i)) text.push(lines[i++].trim());
    blocks.push({ type: "paragraph", from, to: i, text: text.join("\n") });
  }
  return blocks;
}

// One list item from lines[start]: its content is the rest of the marker's line, the lines
// indented to its content (nested lists among them), blank lines followed by such a line,
// and a paragraph's unindented continuation lines. Each item is a block of its own (the view
// puts consecutive items of one kind in one list), so that a long list streams item by item.
function listItem(lines, start, item, blocks) {
  // nested content: indented to the content column, or at least two spaces past the marker
  const inside = Math.min(item.width, item.indent + 2);
  const content = [item.rest];
  let i = start + 1;
  let lazy = item.rest.trim() !== "";   // the last line was paragraph text: an unindented line continues it
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) {
      let next = i + 1;
      while (next < lines.length && isBlank(lines[next])) next += 1;
      if (next < lines.length && indentOf(lines[next]) >= inside) {
        while (i < next) content.push(lines[i++].trim());
        lazy = false;
        continue;
      }
      break;
    }
    if (indentOf(line) >= inside) {
      content.push(line.slice(Math.min(item.width, indentOf(line))));
      lazy = !startsBlock(lines, i);
    } else if (lazy && !startsBlock(lines, i) && !itemStart(line)) {
      content.push(line.trim());
    } else {
      break;
    }
    i += 1;
  }
  // a blank line that ends the item belongs to no block: the next block starts after it
  blocks.push({ type: "item", from: start, to: i, ordered: item.ordered, key: item.key, number: item.number, blocks: parseBlocks(content) });
  return i;
}

// ------------------------------------------------------------------------------ inline

// The run of `char` that starts at text[at] ("***", "``"), without copying the text.
function runAt(text, at, char) {
  let end = at;
  while (text[end] === char) end += 1;
  return text.slice(at, end);
}

const PUNCTUATION = /[!-/:-@[-`{-~\p{P}\p{S}]/u;
const WHITESPACE = /\s/u;

// A URL a link may point to: absolute http: or https:, as the URL parser reads it (tabs and
// newlines inside it are dropped by the parser, so "java\nscript:" cannot slip through).
export function safeHref(raw) {
  let url;
  try {
    url = new URL(String(raw).trim());
  } catch {
    return null;
  }
  return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
}

// The index just past the ] that closes the [ at `open`, or -1 (brackets nest; code spans
// and backslash escapes are skipped).
function closingBracket(text, open) {
  let depth = 0;
  const limit = Math.min(text.length, open + 2000);     // a label is short: no quadratic scans of "[[[["
  for (let i = open; i < limit; i += 1) {
    const c = text[i];
    if (c === "\\") i += 1;
    else if (c === "`") {
      const run = runAt(text, i, "`");
      const end = text.indexOf(run, i + run.length);
      if (end > 0) i = end + run.length - 1;
    } else if (c === "[") depth += 1;
    else if (c === "]" && --depth === 0) return i + 1;
  }
  return -1;
}

// `(destination "optional title")` at text[at]: {href, end} or null.
function linkTarget(text, at) {
  if (text[at] !== "(") return null;
  const m = /^\(\s*(?:<([^<>\n]*)>|((?:[^\s()\\]|\\.|\((?:[^\s()\\]|\\.)*\))*))(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)/.exec(text.slice(at));
  if (!m) return null;
  return { href: m[1] ?? m[2].replace(/\\(.)/g, "$1"), end: at + m[0].length };
}

// A bare http(s) URL at text[at] (GitHub's autolinks), without trailing punctuation.
function bareUrl(text, at) {
  const m = /^https?:\/\/[^\s<>"'`]+/i.exec(text.slice(at, at + 2048));
  if (!m) return null;
  let url = m[0];
  while (/[.,:;!?*_~)\]]$/.test(url)) {
    // a closing parenthesis stays when it closes one inside the URL (Wikipedia's links)
    if (url.endsWith(")") && (url.match(/\(/g) ?? []).length >= (url.match(/\)/g) ?? []).length) break;
    url = url.slice(0, -1);
  }
  return url;
}

// Inline nodes of one block's text: strings, and {type: code | em | strong | del | link | br
// | delim, ...}. Emphasis follows CommonMark's delimiter runs, simplified (no rule of 3).
export function parseInline(text) {
  const nodes = [];
  let plain = "";
  const flush = () => {
    if (plain) nodes.push(plain);
    plain = "";
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === "\\" && i + 1 < text.length && /[!-/:-@[-`{-~]/.test(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
    } else if (c === "\\" && text[i + 1] === "\n") {
      flush();
      nodes.push({ type: "br" });
      i += 2;
    } else if (c === "\n") {
      plain = plain.replace(/ +$/, "");
      flush();
      nodes.push({ type: "br" });
      i += 1;
    } else if (c === "`") {
      const run = runAt(text, i, "`");
      // the closing run is exactly as long: a longer run of backticks is skipped whole
      let end = text.indexOf(run, i + run.length);
      while (end > 0 && text[end + run.length] === "`") end = text.indexOf(run, end + runAt(text, end, "`").length);
      if (end < 0) {
        plain += run;
        i += run.length;
        continue;
      }
      let code = text.slice(i + run.length, end).replace(/\n/g, " ");
      if (/^ .*[^ ].* $/.test(code)) code = code.slice(1, -1);
      flush();
      nodes.push({ type: "code", text: code });
      i = end + run.length;
    } else if (c === "*" || c === "_" || c === "~") {
      const run = runAt(text, i, c);
      const before = i > 0 ? text[i - 1] : " ";
      const after = text[i + run.length] ?? " ";
      const left = !WHITESPACE.test(after) && (!PUNCTUATION.test(after) || WHITESPACE.test(before) || PUNCTUATION.test(before));
      const right = !WHITESPACE.test(before) && (!PUNCTUATION.test(before) || WHITESPACE.test(after) || PUNCTUATION.test(after));
      // an underscore inside a word (snake_case) is not emphasis
      const open = c === "_" ? left && (!right || PUNCTUATION.test(before)) : left;
      const close = c === "_" ? right && (!left || PUNCTUATION.test(after)) : right;
      flush();
      nodes.push({ type: "delim", char: c, count: run.length, open, close });
      i += run.length;
    } else if (c === "[" || (c === "!" && text[i + 1] === "[")) {
      const image = c === "!";
      const open = image ? i + 1 : i;
      const close = closingBracket(text, open);
      const target = close > 0 ? linkTarget(text, close) : null;
      if (!target) {
        plain += c;
        i += 1;
        continue;
      }
      const href = safeHref(target.href);
      if (href === null) {
        plain += text.slice(i, target.end);   // shown as the model wrote it
      } else {
        flush();
        // an image is not loaded (it would leave the page): it becomes a link to it
        const label = text.slice(open + 1, close - 1);
        nodes.push({ type: "link", href, children: image ? [label || href] : parseInline(label) });
      }
      i = target.end;
    } else if (c === "<" && /^<https?:\/\/[^\s<>]+>/i.test(text.slice(i, i + 2048))) {
      const url = text.slice(i + 1, text.indexOf(">", i));
      const href = safeHref(url);
      if (href === null) plain += `<${url}>`;
      else {
        flush();
        nodes.push({ type: "link", href, children: [url] });
      }
      i += url.length + 2;
    } else if ((c === "h" || c === "H") && (i === 0 || /[\s(["']/.test(text[i - 1])) && bareUrl(text, i)) {
      const url = bareUrl(text, i);
      const href = safeHref(url);
      if (href === null) plain += url;
      else {
        flush();
        nodes.push({ type: "link", href, children: [url] });
      }
      i += url.length;
    } else {
      plain += c;
      i += 1;
    }
  }
  flush();
  return emphasis(nodes);
}

// Pair the delimiter runs into em (one), strong (two) and del (~~): each closer takes the
// nearest opener of its character before it; runs left unpaired stay as their characters.
function emphasis(nodes) {
  for (let c = 0; c < nodes.length; c += 1) {
    const closer = nodes[c];
    if (closer.type !== "delim" || !closer.close || closer.count === 0) continue;
    let o = c - 1;
    while (o >= 0 && !(nodes[o].type === "delim" && nodes[o].open && nodes[o].char === closer.char && nodes[o].count > 0)) o -= 1;
    if (o < 0) continue;
    const opener = nodes[o];
    if (closer.char === "~" && (opener.count !== 2 || closer.count !== 2)) continue;
    const use = closer.char === "~" ? 2 : Math.min(2, opener.count, closer.count);
    const type = closer.char === "~" ? "del" : use === 2 ? "strong" : "em";
    const inner = nodes.splice(o + 1, c - o - 1, { type, children: null });
    nodes[o + 1].children = inner;
    opener.count -= use;
    closer.count -= use;
    c = o + 1;                        // the closer is now right after the new node
    if (closer.count > 0) c -= 1;     // what is left of it may close an earlier opener
  }
  return nodes.filter((n) => n.type !== "delim" || n.count > 0);
}

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
