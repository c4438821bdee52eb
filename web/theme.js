// The remembered theme, applied before the first paint (app.mjs, a module, runs after it).
// A classic script of its own rather than inline, so the page runs under a Content-Security-
// Policy without 'unsafe-inline' (serve.py). ui-settings.mjs writes the same key.
try {
  const theme = localStorage.getItem("webslm.theme");
  if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
} catch {}
