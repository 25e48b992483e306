"""`harness.notebooks.lab`: the `proctor` kernelspec (this environment's Python) and `proctor lab` / `make lab`.

The kernelspec lives in the environment (sys.prefix), never in the user's Jupyter folder; one of the same name
earlier on Jupyter's path running another Python is refused (`kernel_not_project`) unless `lab_env` puts the
environment first. `proctor lab` really starts JupyterLab on loopback with the repository as its root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Code, Refusal
from harness.notebooks.lab import (
    KERNEL_NAME,
    kernel_spec,
    kernelspec_dir,
    lab_argv,
    lab_env,
    project_kernel,
)
from harness.notebooks.stage import KERNEL_NAME as PAPERMILL_KERNEL
from tests.support.cli import run_proctor
from tests.support.lab import free_port
from tests.support.paths import REPO


def test_the_kernelspec_is_this_python_in_the_environment(tmp_path: Path) -> None:
    assert PAPERMILL_KERNEL == KERNEL_NAME == "proctor"  # papermill and JupyterLab start the same kernel
    folder = project_kernel(prefix=str(tmp_path))
    assert folder == kernelspec_dir(str(tmp_path)) == str(tmp_path / "share" / "jupyter" / "kernels" / "proctor")
    spec = json.loads((Path(folder) / "kernel.json").read_text())
    assert spec == kernel_spec() and spec["argv"][0] == os.path.abspath(sys.executable)
    assert spec["argv"][1:3] == ["-m", "ipykernel_launcher"]
    before = (Path(folder) / "kernel.json").stat().st_mtime_ns
    project_kernel(prefix=str(tmp_path))  # again: unchanged
    assert (Path(folder) / "kernel.json").stat().st_mtime_ns == before
    (Path(folder) / "kernel.json").write_text(json.dumps({**spec, "argv": ["/usr/bin/python3", *spec["argv"][1:]]}))
    project_kernel(prefix=str(tmp_path))  # another Python named: rewritten
    assert json.loads((Path(folder) / "kernel.json").read_text()) == kernel_spec()
    # the environment's own copy, which Jupyter finds by default
    assert Path(kernelspec_dir(), "kernel.json").is_file()


def shadow(tmp_path: Path) -> Path:
    other = tmp_path / "elsewhere" / "kernels" / "proctor"
    other.mkdir(parents=True)
    (other / "kernel.json").write_text(json.dumps({**kernel_spec("/usr/bin/python3"), "display_name": "other"}))
    return tmp_path / "elsewhere"


def test_a_proctor_kernel_of_another_python_earlier_on_the_path_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_PATH", str(shadow(tmp_path)))
    with pytest.raises(Refusal) as got:
        project_kernel()
    assert got.value.code == Code.KERNEL_NOT_PROJECT
    assert "elsewhere" in str(got.value.path) and "/usr/bin/python3" in got.value.message
    env = lab_env()  # what proctor lab runs Jupyter with: the environment's folder first
    assert env["JUPYTER_PATH"].split(os.pathsep) == [os.path.join(sys.prefix, "share", "jupyter"),
                                                      str(tmp_path / "elsewhere")]
    monkeypatch.setenv("JUPYTER_PATH", env["JUPYTER_PATH"])
    assert project_kernel() == kernelspec_dir()


def test_lab_argv_is_loopback_with_the_root_and_the_proctor_kernel(tmp_path: Path) -> None:
    argv = lab_argv(tmp_path, port=8899, token="t0k", open_browser=False)
    assert argv[:3] == [sys.executable, "-m", "jupyterlab"]
    for flag in ("--ip=127.0.0.1", "--port=8899", f"--ServerApp.root_dir={tmp_path}", "--ServerApp.open_browser=False",
                 "--MappingKernelManager.default_kernel_name=proctor", "--IdentityProvider.token=t0k"):
        assert flag in argv
    assert not any(a.startswith("--IdentityProvider.token") for a in lab_argv(tmp_path))  # Jupyter draws one


def test_proctor_lab_kernel_only_installs_and_names_the_kernelspec() -> None:
    got = run_proctor("lab", "--kernel-only")
    assert got.code == 0 and got.out == {"ok": True, "kernel": "proctor", "kernelspec": kernelspec_dir()}


def test_proctor_lab_serves_the_repository_on_loopback_with_the_proctor_kernel(tmp_path: Path) -> None:
    port, token = free_port(), "lab-test-token"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PROCTOR_"))}
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        env[name] = str(tmp_path / name.lower())
    env["JUPYTER_PATH"] = str(shadow(tmp_path))  # a stray `proctor` kernelspec: proctor lab puts the venv's first
    argv = [sys.executable, "-m", "harness", "lab", "--port", str(port), "--token", token, "--no-browser"]
    proc = subprocess.Popen(argv, cwd=REPO / "docs", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)

    def api(path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/{path}?token={token}", timeout=5) as got:
            return json.loads(got.read())

    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                specs = api("kernelspecs")
                break
            except OSError:
                assert time.monotonic() < deadline, "JupyterLab did not answer in 90 s"
                time.sleep(0.2)
        assert specs["default"] == "proctor"
        assert specs["kernelspecs"]["proctor"]["spec"]["argv"][0] == os.path.abspath(sys.executable)
        names = {e["name"] for e in api("contents/notebooks")["content"]}  # the repository's root, from docs/
        assert {"run_study.ipynb", "analysis.ipynb", "new_study.ipynb"} <= names
        with pytest.raises(urllib.error.HTTPError):  # a token is required
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/kernelspecs", timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
