"""JupyterLab in a real browser (issue 19): Selenium drives Debian's headless Chromium through `proctor lab`'s server.

One JupyterLab for the module (a free loopback port, a token, the `proctor` kernel) serves a checkout laid out
under a temporary folder: the demo preregistration and a small frozen study run against the simulator. The
browser opens `run_study.ipynb` (a dry run of the demo's stage A) and `analysis.ipynb` (the small study), runs
every cell from the Run menu, and the test reads the DOM: every code cell ran on the `proctor` kernel, no error,
tables (`<table>`) and figures (`<img>`) in the output areas. A screenshot of each is kept under the test's
temporary folder (and build/lab/ for a look). Where the browser cannot run the test fails in CI, skips elsewhere.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from papermill.iorw import load_notebook_node
from papermill.parameterize import parameterize_notebook

from harness.notebooks.lab import DISPLAY_NAME
from tests.support.browser import png_stats
from tests.support.lab import Lab, browser, browser_tools, lab_server, run_all, screenshot
from tests.support.paths import REPO, checkout_at
from tests.support.study import prereg, sim_servers, system, urls

ARTEFACTS = REPO / "build" / "lab"


def notebook_with(root: Path, name: str, parameters: dict[str, Any]) -> str:
    """notebooks/<name> copied under `root` with `parameters` injected as papermill injects them."""
    nb = parameterize_notebook(load_notebook_node(str(REPO / "notebooks" / name)), parameters, report_mode=False)
    (root / "notebooks").mkdir(exist_ok=True)
    nbformat.write(nb, root / "notebooks" / name)
    return f"notebooks/{name}"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, Any, Path]]:
    browser_tools()  # before anything is set up: fail in CI, skip elsewhere, when the browser cannot run
    base = tmp_path_factory.mktemp("lab")
    root = checkout_at(base / "checkout")
    shutil.copytree(REPO / "prereg" / "demo", root / "prereg" / "demo")
    with sim_servers(base) as sim:
        from harness.run.runner import run_stage

        url = sim([system("sim-flash", 0.8), system("sim-glm", 0.5)])
        small = prereg(root, items=6)
        assert run_stage(small, "A", root / "results", base_urls=urls(url)).exit_code == 0
    with lab_server(root, base / "home") as server, browser(base / "home") as driver:
        yield server, driver, base


def code_cells(notebook: Path) -> int:
    return sum(c["cell_type"] == "code" for c in json.loads(notebook.read_text())["cells"])


def keep(png: Path) -> None:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(png, ARTEFACTS / png.name)


# One test for both notebooks: under xdist two tests of a module may go to two workers, each starting a server.
@pytest.mark.timeout(1200)  # a loaded 2-core CI machine (the Ray cluster tests beside it) can be slow; a hang still fails
def test_run_study_and_analysis_run_and_render_in_jupyterlab(lab: tuple[Lab, Any, Path]) -> None:
    server, driver, base = lab
    # run_study.ipynb: a dry run of the demo's stage A
    path = notebook_with(server.root, "run_study.ipynb",
                         {"prereg": "prereg/demo", "stage": "A", "results": "results", "dry_run": True})
    got = run_all(driver, server, path)
    png = screenshot(driver, base / "run_study.png")
    keep(png)
    assert got.errors == [], got.errors
    assert got.kernel == DISPLAY_NAME, got  # the project's kernel, by name
    assert got.executed == got.cells == code_cells(server.root / path), got
    assert got.tables >= 4, got  # preflight, the cells of the dry run, summary, anchors
    assert got.math == 0, got  # "spend $0.0000 of ceiling $3.2000" is text, not TeX
    assert not (server.root / "results" / "demo").exists()  # a dry run writes nothing
    assert png_stats(png)[2] > 10.0  # not a blank page

    # analysis.ipynb: the small study run against the simulator
    path = notebook_with(server.root, "analysis.ipynb", {"results": "results/rt", "prereg": "prereg/rt"})
    got = run_all(driver, server, path, timeout=720)
    assert got.errors == [], got.errors
    assert got.kernel == DISPLAY_NAME, got
    assert got.executed == got.cells == code_cells(server.root / path), got  # every cell rendered
    assert got.tables >= 8, got  # validation, q, comparisons, break-even, power, provenance, outputs, ...
    assert got.images >= 3, got  # the forest, savings and sensitivity figures
    assert got.math == 0, got
    analysis = server.root / "results" / "rt" / "analysis"
    assert (analysis / "tables" / "q.csv").is_file() and (analysis / "figures" / "forest.png").is_file()
    driver.execute_script("document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) "
                          ".jp-OutputArea-output img').scrollIntoView({block: 'center'});")
    png = screenshot(driver, base / "analysis.png")
    keep(png)
    width, height, variance = png_stats(png)
    assert width >= 800 and height >= 600, (width, height)
    assert variance > 10.0  # a figure and text, not a blank page
