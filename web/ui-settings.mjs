// The settings the user controls: the system prompt, the sampling controls and the theme.
// An empty sampling box is left out of the request: the engine then uses the model's default,
// and for the seed draws a fresh one per answer (reported back in the answer's webslm.seed),
// so Regenerate gives a new answer unless a seed is set.

const $ = (id) => document.getElementById(id);

// control id -> [request key, parse]
const SAMPLING = {
  "temperature": ["temperature", Number],
  "top-p": ["top_p", Number],
  "top-k": ["top_k", (v) => Number.parseInt(v, 10)],
  "max-tokens": ["max_tokens", (v) => Number.parseInt(v, 10)],
  "seed": ["seed", (v) => Number.parseInt(v, 10)],
};

// The sampling fields of a request: the controls' values, then `overrides` (window.webslm.ask's
// settings) on top. Out-of-range values are passed on as typed: the engine rejects them with a
// bad-request error that says which field is wrong, which is shown under the answer.
// The page's own default length of an answer: the model's (its manifest's max_new_tokens),
// at most this many tokens, so that an answer that loops ends in reasonable time.
export const PAGE_MAX_TOKENS = 1024;
let defaultMaxTokens = null;   // set from the loaded model's defaults (showModelDefaults)

export function samplingSettings(overrides = {}) {
  const settings = {};
  for (const [id, [key, parse]] of Object.entries(SAMPLING)) {
    const raw = $(id).value.trim();
    if (raw !== "") settings[key] = parse(raw);
  }
  if (settings.max_tokens === undefined && defaultMaxTokens !== null) settings.max_tokens = defaultMaxTokens;
  return Object.assign(settings, overrides);
}

// The system message, or null when the box is empty (the chat template's own default applies).
export function systemPrompt() {
  const text = $("system-prompt").value.trim();
  return text === "" ? null : text;
}

// The model's generation defaults as the placeholders of the sampling boxes, when the engine
// reports them (engine.model.generation, the .slm manifest's); "default" otherwise.
export function showModelDefaults(generation) {
  const modelMax = generation?.max_new_tokens ?? generation?.max_tokens;
  defaultMaxTokens = Number.isInteger(modelMax) ? Math.min(modelMax, PAGE_MAX_TOKENS) : PAGE_MAX_TOKENS;
  const defaults = {
    "temperature": generation?.temperature, "top-p": generation?.top_p,
    "top-k": generation?.top_k, "max-tokens": defaultMaxTokens,
  };
  for (const [id, value] of Object.entries(defaults)) $(id).placeholder = value === undefined ? "default" : `${value} (default)`;
  $("length-note").textContent = `An answer ends after at most ${defaultMaxTokens} new tokens unless Max tokens says otherwise`
    + (Number.isInteger(modelMax) && modelMax > defaultMaxTokens ? ` (the model allows ${modelMax}; this page stops at ${PAGE_MAX_TOKENS}).` : ".");
}

// Theme: "light" or "dark" pins data-theme on <html> (the CSS follows it); "system" removes
// it, and prefers-color-scheme decides. The choice is remembered in localStorage (which may be
// unavailable, e.g. in some private modes: then it lasts for this visit only).
const THEME_KEY = "webslm.theme";
const THEMES = ["system", "light", "dark"];

export function setTheme(theme) {
  if (!THEMES.includes(theme)) throw new Error(`theme must be one of ${THEMES.join(", ")}`);
  if (theme === "system") delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = theme;
  $("theme").value = theme;
  try {
    localStorage.setItem(THEME_KEY, theme);
  } catch {
    // storage refused: the theme still applies to this visit
  }
}

export function wireTheme() {
  let saved = "system";
  try {
    saved = localStorage.getItem(THEME_KEY) ?? "system";
  } catch {
    // storage refused: follow the system
  }
  setTheme(THEMES.includes(saved) ? saved : "system");
  $("theme").addEventListener("change", (e) => setTheme(e.target.value));
}
