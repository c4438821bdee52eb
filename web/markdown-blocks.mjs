// Markdown's block structure for markdown.mjs: the lines of an answer into blocks (paragraphs,
// fenced code, headings, rules, quotes, list items, tables), each with the lines that made it.
// Text is kept as written; markdown.mjs renders it (inline parsing: markdown-inline.mjs).
//
// The grammar is markdown.mjs's subset of CommonMark + GitHub's tables: no setext headings,
// no indented code blocks, no raw HTML; a single newline inside a paragraph is a line break.
// MarkdownView streams on parseBlocks' promise (below) and reuses the fence helpers to grow an
// open code block line by line.

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
export function fenceOpen(line) {
  const m = FENCE_OPEN.exec(line);
  if (!m || (m[2][0] === "`" && m[3].includes("`"))) return null;
  return { indent: m[1].length, char: m[2][0], length: m[2].length, lang: m[3].trim().split(/\s+/)[0] };
}

export function closesFence(line, fence) {
  const m = /^ {0,3}(`{3,}|~{3,})[ \t]*$/.exec(line);
  return Boolean(m) && m[1][0] === fence.char && m[1].length >= fence.length;
}

// A code line without the opening fence's indentation (as far as it is spaces).
export const codeLine = (line, indent) => line.slice(Math.min(indent, indentOf(line)));

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
