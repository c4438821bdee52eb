// Markdown's inline syntax for markdown.mjs: a block's text into nodes (text, emphasis and
// strikethrough, inline code, links and bare http(s) URLs, line breaks), and safeHref, the
// only gate between model text and a link's href.

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
