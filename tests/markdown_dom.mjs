// A small stand-in for the browser's DOM, enough for web/markdown.mjs to render into under
// node (tests/test_markdown.py). It records every node created and every attribute set, so
// that the tests can check what model text could reach (tags, attributes, hrefs), and it
// refuses the doors that would parse HTML (innerHTML, outerHTML, insertAdjacentHTML).

export const created = { elements: 0, texts: 0 };

class Node {
  constructor(doc) {
    this.ownerDocument = doc;
    this.parentNode = null;
    this.childNodes = [];
  }

  get lastElementChild() {
    return [...this.childNodes].reverse().find((n) => n instanceof Element) ?? null;
  }

  #adopt(node) {
    if (typeof node === "string") node = this.ownerDocument.createTextNode(node);
    node.remove();
    node.parentNode = this;
    return node;
  }

  append(...nodes) {
    for (const node of nodes) this.childNodes.push(this.#adopt(node));
  }

  insertBefore(node, ref) {
    const adopted = this.#adopt(node);
    const at = this.childNodes.indexOf(ref);
    if (at < 0) throw new Error("insertBefore: not a child");
    this.childNodes.splice(at, 0, adopted);
  }

  remove() {
    if (!this.parentNode) return;
    const siblings = this.parentNode.childNodes;
    siblings.splice(siblings.indexOf(this), 1);
    this.parentNode = null;
  }

  replaceChildren(...nodes) {
    for (const child of [...this.childNodes]) child.remove();
    this.append(...nodes);
  }

  get textContent() {
    return this.childNodes.map((n) => n.textContent).join("");
  }

  set textContent(text) {
    this.replaceChildren(this.ownerDocument.createTextNode(String(text)));
  }
}

class Text extends Node {
  constructor(doc, data) {
    super(doc);
    this.data = String(data);
    created.texts += 1;
  }

  get textContent() { return this.data; }
  set textContent(text) { this.data = String(text); }
}

const refuse = (what) => () => { throw new Error(`${what} was used: model text must not be parsed as HTML`); };

class Element extends Node {
  constructor(doc, tag) {
    super(doc);
    this.tagName = tag.toUpperCase();
    this.attributes = {};
    this.dataset = {};
    this.listeners = {};
    created.elements += 1;
  }

  setAttribute(name, value) { this.attributes[name] = String(value); }
  getAttribute(name) { return this.attributes[name] ?? null; }
  addEventListener(type, listener) { (this.listeners[type] ??= []).push(listener); }
  click() { for (const listener of this.listeners.click ?? []) listener({ type: "click", target: this }); }

  // the properties markdown.mjs sets, as the attributes they reflect
  set className(v) { this.setAttribute("class", v); }
  get className() { return this.getAttribute("class") ?? ""; }
  set href(v) { this.setAttribute("href", v); }
  get href() { return this.getAttribute("href"); }
  set rel(v) { this.setAttribute("rel", v); }
  set target(v) { this.setAttribute("target", v); }
  set type(v) { this.setAttribute("type", v); }
  set start(v) { this.setAttribute("start", v); }
  set innerHTML(_) { refuse("innerHTML")(); }
  set outerHTML(_) { refuse("outerHTML")(); }
  insertAdjacentHTML = refuse("insertAdjacentHTML");
}

export class Document {
  constructor() {
    this.copied = [];
    const doc = this;
    this.defaultView = {
      navigator: { clipboard: { writeText: async (text) => { doc.copied.push(text); } } },
      setTimeout: () => 0,
    };
  }

  createElement(tag) { return new Element(this, tag); }
  createTextNode(text) { return new Text(this, text); }
}

// A node as JSON: text as a string (adjacent text nodes merged), an element as
// [tag, {attributes and data-*}, ...children].
export function tree(node) {
  if (node instanceof Text) return node.data;
  const attrs = { ...node.attributes };
  for (const [k, v] of Object.entries(node.dataset)) attrs[`data-${k}`] = v;
  const children = [];
  for (const child of node.childNodes) {
    const value = tree(child);
    if (typeof value === "string" && typeof children.at(-1) === "string") children[children.length - 1] += value;
    else if (value !== "") children.push(value);
  }
  return [node.tagName.toLowerCase(), attrs, ...children];
}

// Every element under `node` (itself excluded), depth first.
export function elements(node, out = []) {
  for (const child of node.childNodes) {
    if (child instanceof Element) {
      out.push(child);
      elements(child, out);
    }
  }
  return out;
}
