"""JupyterLab on a free loopback port, and Selenium driving Debian's headless Chromium (chromium-driver) in it.

`lab_server` starts `jupyter lab` the way `proctor lab` does (`harness.notebooks.lab`), with a token and with
Jupyter's config, data, runtime, settings and workspace folders under a temporary folder (never the user's).
`browser` starts chromedriver; where it cannot run the test fails in CI (CI=true) and skips elsewhere, saying why.
`run_all` opens a notebook, runs every cell through the Run menu and waits for the kernel to finish.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.notebooks.lab import lab_argv, lab_env, project_kernel
from tests.support.paths import checkout_at
from tests.support.study import Sim, logs, prereg, system

WIDTH, HEIGHT = 1400, 1000


def slow_study(root: Path, sim: Sim, latency: float) -> tuple[Path, Path, str]:
    """A frozen 8-item study (sim-flash always passes, sim-glm never) in a checkout at `root`, attempts taking
    `latency` seconds: (the preregistration, the results root, the simulator's URL)."""
    checkout_at(root)
    url = sim([system("sim-flash", 1.0, latency=latency), system("sim-glm", 0.0, latency=latency)],
              latency_scale=1.0)
    return prereg(root, items=8), root / "results", url


def assert_interrupted_gracefully(folder: Path, signum: int) -> None:
    """The run logs one signal (`signum`, count 1), a stop with cause `interrupt` and its end (exit 1); nothing
    started after the signal, an attempt was under way then and finished, every attempt has its run event, and
    the stage was anchored at its end."""
    got = logs(folder)
    sig = [e for e in got["run"] if e["event"] == "signal"]
    assert [(e["signum"], e["count"]) for e in sig] == [(int(signum), 1)]
    assert [e["cause"] for e in got["run"] if e["event"] == "stop"] == ["interrupt"]
    assert got["run"][-1]["event"] == "end" and got["run"][-1]["exit_code"] == 1
    at = sig[0]["at"]
    assert all(a["started"] <= at for a in got["attempts"])
    assert any(a["ended"] > at for a in got["attempts"]), "no attempt was under way at the signal"
    assert len([e for e in got["run"] if e["event"] == "attempt"]) == len(got["attempts"])
    assert "end" in [a["reason"] for a in got["anchors"]]


@dataclass(frozen=True)
class Lab:
    url: str  # http://127.0.0.1:PORT
    token: str
    root: Path
    log: Path

    def open_url(self, path: str, workspace: str) -> str:
        """`path` opened in a new, empty workspace: no tab of an earlier page is restored beside it."""
        return f"{self.url}/lab/workspaces/{workspace}/tree/{path}?reset&token={self.token}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def unavailable(why: str) -> None:
    """Fail in CI (the browser test must run there), skip elsewhere, saying why."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the JupyterLab browser test cannot run here: {why}")
    pytest.skip(why)


@contextlib.contextmanager
def lab_server(root: Path, home: Path) -> Iterator[Lab]:
    """`jupyter lab` on a free loopback port with a token, `root` as its root; stopped with SIGTERM."""
    project_kernel()
    token = os.urandom(16).hex()
    port = free_port()
    env = lab_env({k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PROCTOR_"))})
    for name, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"),
                      ("JUPYTER_RUNTIME_DIR", "runtime"), ("JUPYTERLAB_SETTINGS_DIR", "settings"),
                      ("JUPYTERLAB_WORKSPACES_DIR", "workspaces")):
        (home / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(home / sub)
    news = home / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True, exist_ok=True)  # no "news" question over the notebook
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    # JupyterLab 4 renders only the cells near the viewport ("windowing"): every cell in the page, so a
    # notebook's whole output is counted, not what one screen happened to hold
    tracker = home / "settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True, exist_ok=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    env["HOME"] = str(home)
    log = home / "jupyter.log"
    argv = [*lab_argv(root, port=port, token=token, open_browser=False), "--LabApp.expose_app_in_browser=True"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as got:
                    if got.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "JupyterLab did not answer in 90 s:\n" + log.read_text()[-3000:]
            time.sleep(0.2)
        yield Lab(url, token, root, log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def browser_tools() -> tuple[str, str]:
    """(chromium, chromedriver), with Selenium importable; else fail in CI, skip elsewhere, saying why."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        unavailable("chromium and chromium-driver are not installed here "
                    "(Debian: apt-get install chromium chromium-driver; .ci/run installs them)")
    try:
        import selenium  # noqa: F401
    except ImportError:
        unavailable("selenium is not installed (pip install -e '.[dev]')")
    return str(chromium), str(driver_path)


@contextlib.contextmanager
def browser(home: Path) -> Iterator[Any]:
    """Selenium's Chrome driver on Debian's chromium and chromium-driver, headless."""
    chromium, driver_path = browser_tools()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 f"--window-size={WIDTH},{HEIGHT}", f"--user-data-dir={home / 'chromium-profile'}"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=str(driver_path),
                                                                   log_output=str(home / "chromedriver.log")))
    except Exception as exc:
        unavailable(f"chromedriver could not start chromium: {exc}")
    try:
        driver.set_window_size(WIDTH, HEIGHT)
        yield driver
    finally:
        driver.quit()


def _wait(driver: Any, what: str, script: str, path: str, timeout: float, *, fail: bool = True) -> Any:
    """Poll `script` (given `path` as its argument) until it returns something true; on the deadline fail naming
    `what` and the notebook's state (or return None when `fail` is False)."""
    deadline = time.monotonic() + timeout
    while True:
        got = driver.execute_script(script, path)
        if got:
            return got
        if time.monotonic() >= deadline:
            if not fail:
                return None
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}; the notebook: "
                                 f"{driver.execute_script(_STATE, path)}")
        time.sleep(0.25)


def _click_menu(driver: Any, menu: str, item: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, f"//li[contains(@class,'lm-MenuBar-item')][.//div[text()='{menu}']]").click()
    entry = f"//li[contains(@class,'lm-Menu-item')][.//div[contains(@class,'lm-Menu-itemLabel')][text()='{item}']]"
    _wait(driver, f"menu item {item}", "return document.evaluate(arguments[0], document, null, 9, null)"
          ".singleNodeValue !== null", entry, 10)
    driver.find_element(By.XPATH, entry).click()


@dataclass(frozen=True)
class Rendered:
    kernel: str  # the kernel's display name in the notebook's toolbar
    cells: int  # code cells
    executed: int  # code cells with an execution count
    tables: int  # <table> elements in output areas
    images: int  # <img> elements in output areas
    errors: list[str]  # the text of every error output
    math: int  # output areas MathJax typeset (a table's "$0.01 ... $3.2" read as TeX)


# the state of the notebook at `arguments[0]` (its path under the root): found by path among the app's open
# documents, never by which tab happens to be current or shown
_STATE = """
const app = window.jupyterapp;
if (!app) { return null; }
const widget = [...app.shell.widgets('main')].find(w => w.context && w.context.path === arguments[0]);
if (!widget || !widget.content || !widget.content.model) { return null; }
const panel = widget.node;
const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim());
const kernel = panel.querySelector('.jp-KernelName, .jp-Toolbar-kernelName');
// the notebook's model, whatever the page has rendered of it yet: its code cells and how many have run
const model = widget.content.model;
let modelCells = 0, modelRun = 0;
for (let i = 0; i < model.cells.length; i++) {
    const cell = model.cells.get(i);
    if (cell.type === 'code') { modelCells += 1; if (cell.executionCount !== null) { modelRun += 1; } }
}
const session = widget.sessionContext && widget.sessionContext.session;
return {path: widget.context.path, current: app.shell.currentWidget === widget,
        kernel: kernel ? kernel.textContent.trim() : '',
        kernelStatus: session && session.kernel ? session.kernel.status : '',
        modelCells: modelCells, modelRun: modelRun,
        prompts: prompts,
        tables: panel.querySelectorAll('.jp-OutputArea-output table').length,
        images: panel.querySelectorAll('.jp-OutputArea-output img').length,
        math: panel.querySelectorAll('.jp-OutputArea-output mjx-container, .jp-OutputArea-output .MathJax').length,
        errors: [...panel.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]')]
                .map(e => e.textContent.slice(0, 2000))};
"""


def _state(test: str) -> str:
    """A script that returns the notebook's state when `test` (JavaScript over `s`, the state) holds, else null."""
    return "const s = (() => {" + _STATE + "})(); return s && (" + test + ") ? s : null;"


def run_all(driver: Any, lab: Lab, path: str, *, timeout: float = 300) -> Rendered:
    """Open `path` (relative to the lab's root) alone in a new workspace, wait for its kernel, Run > Run All
    Cells, wait until every code cell has run (or one failed), and return what rendered."""
    driver.get(lab.open_url(path, workspace="w" + os.urandom(4).hex()))
    _wait(driver, f"{path} to open as the current tab with an idle kernel",
          _state("s.current && s.kernel && s.kernelStatus === 'idle' && s.prompts.length > 0"), path, 180)
    started = _state("s.modelRun > 0 || s.prompts.some(p => p !== '[ ]:')")
    for _ in range(3):  # a click that landed before the notebook took the focus runs nothing: click again
        _click_menu(driver, "Run", "Run All Cells")
        if _wait(driver, "the first cell to start", started, path, 30, fail=False):
            break
    else:  # the menu's own command, through the app's command registry (what the menu item runs)
        driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
    # done when every code cell of the model has run and the page shows them all (the page renders a long
    # notebook's cells in pieces: its prompts alone can all read "run" while later cells are not in it yet)
    state = _wait(driver, f"every cell of {path} to run",
                  _state("(s.modelCells > 0 && s.modelRun === s.modelCells && s.prompts.length === s.modelCells"
                         " && s.prompts.every(p => /^\\[\\d+\\]:$/.test(p)))"
                         " || (s.errors.length > 0 && !s.prompts.some(p => p === '[*]:'))"), path, timeout)
    return Rendered(kernel=state["kernel"], cells=len(state["prompts"]),
                    executed=sum(1 for p in state["prompts"] if p not in ("[ ]:", "[*]:")),
                    tables=state["tables"], images=state["images"], errors=list(state["errors"]),
                    math=state["math"])


def screenshot(driver: Any, png: Path) -> Path:
    """The browser's viewport as a PNG at `png`."""
    png.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(png)), f"no screenshot at {png}"
    return png


