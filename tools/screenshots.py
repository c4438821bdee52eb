"""Screenshots of the chat page for docs/screenshots/: the start (the model loading, its
progress in the conversation area) and a Markdown answer with a code block, each in the
light and the dark theme at desktop and phone width.

    .venv/bin/python tools/screenshots.py [--row chromium-compat] [--out docs/screenshots]

The site is built (`serve.py --build`) and served as users deploy it; the page is opened as a
user opens it. The start is photographed while the GPU's kernels are self-tested (the row's
GPU must be admitted for that step to exist: chromium-compat and firefox here; in a row
without one, during the model's validation). The answer is the model's own, greedy, to a
question whose answer holds a fenced code block; the question and the first line of the
answer are printed. Writes start-<size>-<theme>.png and answer-<size>-<theme>.png.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests_browser"), str(ROOT)]

import drivers  # noqa: E402
from app_session import static_site  # noqa: E402

QUESTION = "Show a Python one-liner that reverses a string, in a code block."
SIZES = {"desktop": (1200, 800), "phone": (390, 760)}
THEMES = ("light", "dark")


def shoot_all(row, out: pathlib.Path, what: str, before_each: str = "") -> list[str]:
    """The page in each size and theme, as <what>-<size>-<theme>.png; before_each (JS) runs
    after the resize, before the picture (e.g. to scroll)."""
    written = []
    for size, (width, height) in SIZES.items():
        row.set_viewport(width, height)
        for theme in THEMES:
            row.eval("(async () => { window.webslm.setTheme(%s); %s"
                     " await new Promise((r) => setTimeout(r, 350));"
                     " await new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))); return true; })()"
                     % (json.dumps(theme), before_each), timeout_s=30)
            path = out / f"{what}-{size}-{theme}.png"
            row.screenshot(path)
            written.append(str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path))
    return written


def wait(row, js: str, timeout_s: float, poll_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = row.eval(js)
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"timed out waiting for {js}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", default="chromium-compat", choices=drivers.ROW_NAMES)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs/screenshots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as where, static_site(ROOT, pathlib.Path(where)) as port:
        row = drivers.launch(args.row)
        try:
            row.set_viewport(*SIZES["desktop"])
            row.open(f"http://127.0.0.1:{port}/")
            wait(row, "Boolean(window.webslm && window.webslm.setTheme)", 60)
            # the start: during the GPU's self-tests where there is a GPU, else the validation
            step = "Testing the GPU" if row.expects_webgpu else "Checking the model"
            wait(row, f"document.getElementById('start-now').textContent.startsWith({json.dumps(step)})", 600, 0.05)
            shots = shoot_all(row, args.out, "start")
            wait(row, "window.webslm.ready", 900, 0.5)
            row.set_viewport(*SIZES["desktop"])
            answer = row.eval("""(async () => {
              document.getElementById("temperature").value = "0";
              document.getElementById("max-tokens").value = "120";
              const prompt = document.getElementById("prompt");
              prompt.value = %s;
              prompt.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true, cancelable: true }));
              await new Promise((ok) => { const t = setInterval(() => {
                const last = [...document.querySelectorAll("#messages li.assistant")].pop();
                if (last?.dataset.finishReason) { clearInterval(t); ok(); } }, 100); });
              return window.webslm.lastAnswer;
            })()""" % json.dumps(QUESTION), timeout_s=900)
            print(f"{args.row}: {QUESTION!r} -> {answer['text'][:80]!r}… ({answer['backends']})")
            # on a phone the answer's code block is scrolled into view
            scroll = "document.querySelector('#messages .code-block')?.scrollIntoView({ block: 'center' });"
            shots += shoot_all(row, args.out, "answer", scroll)
        finally:
            row.close()
    print("\n".join(shots))


if __name__ == "__main__":
    main()
