"""JupyterLab driven as a learner drives it: a server on a copy of the checkout, pages in headless Chromium.

The server runs on a copy of the working tree with PYTHONPATH pointing at it, so the kernels import the
copy's nanoengine, graders run the copy's tests, and neither a Run All (which marks the notebook dirty)
nor a learner-flow edit of exercises/ ever touches the checkout.

Invariant: a `NotebookPage` looks at the notebook through two windows that must agree: the notebook
model (`window.jupyterapp`, exposed by the server flag below), which says what every output *is*, and
the DOM, which says what the learner *sees*.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

REPO = Path(__file__).resolve().parents[2]
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
BROKEN_WIDGET_TEXT = ("Error displaying widget", "Loading widget")
# JupyterLab settings for a test run: every cell stays in the DOM (the default windowing detaches
# off-screen cells, which a test must then scroll to), and no news pop-up covers the page.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
}
CHROMIUM_PATHS = (
    "/usr/bin/chromium",
    "/usr/bin/chromium-browser",
    "/usr/bin/google-chrome",
    "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
)


def find_chromium() -> str | None:
    """The system's Chromium: Playwright's own browser download is not reachable everywhere."""
    candidates = [os.environ.get("CHROMIUM", "")] + list(CHROMIUM_PATHS)
    return next((p for p in candidates if p and Path(p).exists()), None)


def copy_checkout(dest: Path) -> Path:
    """Tracked and untracked-but-not-ignored files of the checkout, as they are now."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LabServer:
    """`jupyter lab` on a free local port with a token, as `make lab` starts it, over `root`'s notebooks."""

    root: Path
    scratch: Path
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    process: subprocess.Popen | None = None

    def start(self, timeout: float = 90.0) -> LabServer:
        settings = self.scratch / "settings"
        for name, value in SETTINGS.items():
            (settings / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / name).write_text(json.dumps(value))
        env = dict(
            os.environ,
            PYTHONPATH=str(self.root),
            JUPYTER_CONFIG_DIR=str(self.scratch / "config"),
            JUPYTER_RUNTIME_DIR=str(self.scratch / "runtime"),
        )
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab",
            f"--notebook-dir={self.root / 'notebooks'}",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--IdentityProvider.token={self.token}",
            f"--LabApp.user_settings_dir={settings}",
            "--LabApp.expose_app_in_browser=True",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self.log = self.scratch / "jupyterlab.log"
        self.process = subprocess.Popen(cmd, env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: see {self.log}")
            try:
                self.api("GET", "status")
                return self
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"jupyter lab did not answer on port {self.port} in {timeout:.0f} s: see {self.log}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/lab?token={self.token}"

    def api(self, method: str, path: str):
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shut_down_kernels(self) -> None:
        for kernel in self.api("GET", "kernels"):
            self.api("DELETE", f"kernels/{kernel['id']}")


_MODEL = "window.jupyterapp.shell.currentWidget"
_KERNEL = f"{_MODEL}.sessionContext.session?.kernel"


@dataclass
class Widget:
    """One widget output: where it is (code cell, output) and how the test finds its view."""

    cell: int
    output: int
    selector: str
    label: str


def open_lab(page, lab: LabServer, timeout_ms: int = 90_000):
    """Load JupyterLab's front end in `page` and wait until it has restored its layout."""
    page.goto(lab.url())
    page.wait_for_function("() => window.jupyterapp", timeout=timeout_ms)
    page.evaluate("() => window.jupyterapp.restored")
    return page


class NotebookPage:
    """One notebook open in a tab of JupyterLab, in a page where JupyterLab is loaded (`open_lab`).

    Used as a context manager: the tab is open, with its own kernel, inside the `with` block, and
    closed, its kernel shut down and any dialog dismissed after it, so the page is ready for the next
    notebook even when a check failed. The console errors are those logged while the tab was open.
    """

    def __init__(self, page, lab: LabServer, notebook: str):
        self.page, self.lab, self.notebook = page, lab, notebook
        self.console_errors: list[str] = []
        self.kernel_id: str | None = None
        self._listeners = {
            "console": lambda m: self.console_errors.append(m.text) if m.type == "error" else None,
            "pageerror": lambda e: self.console_errors.append(f"uncaught: {e}"),
        }
        for event, listener in self._listeners.items():
            page.on(event, listener)

    def __enter__(self) -> Self:
        try:
            return self.open()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, timeout_ms: int = 90_000) -> Self:
        """The command a double click in the file browser runs: the notebook in a new tab, with a kernel."""
        self.page.evaluate(
            "(path) => { window.jupyterapp.commands.execute('docmanager:open', {path}); }", self.notebook
        )
        self.page.wait_for_function(
            f"() => {_MODEL}?.context?.path === {json.dumps(self.notebook)} && {_KERNEL}?.status === 'idle'",
            timeout=timeout_ms,
        )
        self.kernel_id = self.page.evaluate(f"() => {_KERNEL}.id")
        return self

    def menu(self, menu: str, item: str) -> None:
        """Click a menu of the menu bar, then one of its items, as a learner does."""
        self.page.locator("li.lm-MenuBar-item", has_text=menu).click()
        self.page.locator(".lm-Menu-itemLabel", has_text=item).filter(
            has_text=re.compile(f"^{re.escape(item)}$")
        ).click()

    def run_all(self, timeout_s: float = 300.0) -> None:
        """Run > Run All Cells, then wait until the kernel has been busy and the queue is drained (the
        kernel is idle for a moment before the queue's first cell starts)."""
        self.page.evaluate(f"""() => {{ window.nbtestBusy = false;
            {_KERNEL}.statusChanged.connect((_, status) => {{ if (status === 'busy') window.nbtestBusy = true; }}); }}""")
        self.menu("Run", "Run All Cells")
        self.page.wait_for_function("() => window.nbtestBusy", timeout=timeout_s * 1000, polling=100)
        self.wait_until_idle(timeout_s)

    def wait_until_idle(self, timeout_s: float) -> None:
        """Until no cell waits or runs ([*]) and the kernel is idle: the queue is drained."""
        self.page.wait_for_function(
            f"""() => {_KERNEL}?.status === 'idle' && ![...document.querySelectorAll('.jp-InputPrompt')]
                      .some(p => p.textContent.includes('*'))""",
            timeout=timeout_s * 1000,
            polling=500,
        )

    def run_cell(self, index: int, timeout_s: float = 120.0) -> None:
        """Select cell `index` (0-based, all cells) and run it from the Run menu."""
        before = self.page.evaluate(f"() => {_MODEL}.content.model.cells.get({index}).executionCount")
        self.page.evaluate(f"() => {{ {_MODEL}.content.activeCellIndex = {index}; }}")
        self.menu("Run", "Run Selected Cell")
        self.page.wait_for_function(
            f"() => {_MODEL}.content.model.cells.get({index}).executionCount !== {json.dumps(before)}",
            timeout=timeout_s * 1000,
        )
        self.wait_until_idle(timeout_s)

    def cells(self) -> list[dict]:
        """Every cell as the notebook model holds it: type, source, execution count, outputs (nbformat)."""
        return self.page.evaluate(f"""() => [...{_MODEL}.content.model.cells].map(c => ({{
            type: c.type, source: c.sharedModel.getSource(),
            count: c.type === 'code' ? c.executionCount : null,
            outputs: c.type === 'code' ? c.outputs.toJSON() : []}}))""")

    def output_text(self, index: int) -> str:
        out = self.cells()[index]["outputs"]
        return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", "")) for o in out)

    def errors(self) -> list[str]:
        return [
            f"cell {i}: {o['ename']}: {o['evalue']}"
            for i, cell in enumerate(self.cells())
            for o in cell["outputs"]
            if o["output_type"] == "error"
        ]

    def widgets(self) -> list[Widget]:
        """Tag every widget output's view in the DOM and return them in notebook order."""
        tagged = self.page.evaluate(
            f"""(mime) => {{
            const found = [];
            {_MODEL}.content.widgets.forEach((cell, i) => {{
                if (cell.model.type !== 'code') return;
                cell.model.outputs.toJSON().forEach((o, j) => {{
                    if (!(o.data && o.data[mime])) return;
                    const view = cell.outputArea.widgets[j].node;
                    const tag = `${{i}}-${{j}}`;
                    view.setAttribute('data-nbtest-widget', tag);
                    found.push([i, j, tag, (o.data['text/plain'] || '').split(':')[0]]);
                }});
            }});
            return found; }}""",
            WIDGET_MIME,
        )
        return [Widget(i, j, f'[data-nbtest-widget="{tag}"]', label) for i, j, tag, label in tagged]

    def images(self) -> list[tuple[int, bool]]:
        """(cell, drawn) for every image output: drawn means the browser decoded it to a non-empty image."""
        return self.page.evaluate(f"""() => {{
            const found = [];
            {_MODEL}.content.widgets.forEach((cell, i) => {{
                if (cell.model.type !== 'code') return;
                cell.node.querySelectorAll('.jp-OutputArea-output img').forEach(img =>
                    found.push([i, img.complete && img.naturalWidth > 0]));
            }});
            return found; }}""")

    def close(self) -> None:
        """Close the tab without a save prompt (a Run All leaves it unsaved), then shut its kernel down."""
        if self.page.locator(".jp-Dialog").count():
            self.page.keyboard.press("Escape")
        self.page.evaluate(
            f"""(path) => {{
            const panel = {_MODEL};
            if (panel?.context?.path !== path) return;
            panel.context.model.dirty = false;
            panel.dispose(); }}""",
            self.notebook,
        )
        for event, listener in self._listeners.items():
            self.page.remove_listener(event, listener)
        if self.kernel_id:
            self.lab.api("DELETE", f"kernels/{self.kernel_id}")


def live_view_problem(page, widget: Widget, timeout_s: float = 15.0) -> str | None:
    """None once the widget output is a live ipywidgets view; else what the learner sees instead.

    A model the front-end cannot create or render shows ipywidgets' error widget (an icon, with the
    message behind it); a missing widget manager leaves the text repr; a slow one, "Loading widget…".
    """
    view = page.locator(widget.selector)
    deadline = time.monotonic() + timeout_s
    while True:
        text = view.inner_text().strip()
        if view.locator(".jupyter-widgets-error-widget").count():
            return f"shows ipywidgets' error widget: {text[:120]!r}"
        broken = next((b for b in BROKEN_WIDGET_TEXT if b in text), None)
        if broken is None and view.locator(".jupyter-widgets").count():
            return None
        if time.monotonic() > deadline:
            return f"shows {text[:120]!r}" if broken else f"is not a widget view: {text[:120]!r}"
        time.sleep(0.25)


# One interaction per widget, in this order of preference: what a learner reaches for first.
INTERACTIONS = (
    ("click", "button.jupyter-button:not([disabled]):not(.mod-active):visible"),
    ("slide", ".noUi-handle:visible"),
    ("select", "select:visible"),
    ("type", "textarea:visible, input[type=text]:visible"),
)


def interact(page, widget: Widget, timeout_s: float = 60.0) -> str:
    """Make one interaction with the widget's first control and wait until its view changes.

    Returns what was done; raises AssertionError when the view did not change within the timeout.
    """
    view = page.locator(widget.selector)
    for kind, selector in INTERACTIONS:
        control = view.locator(selector).first
        if control.count():
            break
    else:
        raise AssertionError(f"{widget.label} (cell {widget.cell}) has no button, slider, list or text box")
    before = view.inner_html()
    if kind == "click":
        did = f"clicked {control.inner_text().strip()!r}"
        control.click()
    elif kind == "slide":
        control.focus()
        control.press("ArrowRight")
        did = "moved a slider one step"
    elif kind == "select":
        values = control.locator("option").evaluate_all("os => os.map(o => o.value)")
        current = control.input_value()
        choice = next(v for v in values if v != current)
        control.select_option(choice)
        did = f"picked {choice!r}"
    else:
        control.click()
        control.press("End")
        control.press_sequentially(" and more")
        did = "typed ' and more'"
    deadline = time.monotonic() + timeout_s
    while view.inner_html() == before:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{widget.label} (cell {widget.cell}): {did}, and the view did not change in {timeout_s:.0f} s"
            )
        time.sleep(0.25)
    return did
