"""The researcher's lab: the `proctor` kernelspec (this Python, in this environment) and `make lab`'s JupyterLab.

The manual: docs/notebooks.md (JupyterLab).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any, Final

from harness.errors import Code, NotebookRefusal
from harness.evidence.fsutil import atomic_write

__all__ = ["DISPLAY_NAME", "KERNEL_NAME", "kernel_spec", "kernelspec_dir", "lab_argv", "lab_env",
           "project_kernel"]

KERNEL_NAME: Final = "proctor"
"""The kernel every notebook names and papermill starts: this environment's Python, nothing else."""
DISPLAY_NAME: Final = "Python (proctor)"


def kernel_spec(python: str | None = None) -> dict[str, Any]:
    """The kernel.json of the `proctor` kernel: ipykernel run by `python` (default: this interpreter)."""
    exe = os.path.abspath(python or sys.executable)  # not resolved: a venv's python is a link to the base one
    return {"argv": [exe, "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": DISPLAY_NAME,
            "language": "python", "metadata": {"debugger": True}}


def kernelspec_dir(prefix: str | None = None) -> str:
    """Where the kernelspec lives: `<prefix>/share/jupyter/kernels/proctor` (default prefix: sys.prefix,
    the environment; never the user's own Jupyter folder)."""
    return os.path.join(prefix or sys.prefix, "share", "jupyter", "kernels", KERNEL_NAME)


def _install(prefix: str | None) -> str:
    folder = kernelspec_dir(prefix)
    path = os.path.join(folder, "kernel.json")
    data = (json.dumps(kernel_spec(), indent=1, sort_keys=True) + "\n").encode("utf-8")
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                return folder
    except FileNotFoundError:
        pass
    os.makedirs(folder, exist_ok=True)
    atomic_write(path, data, mode=0o644)
    return folder


def project_kernel(prefix: str | None = None) -> str:
    """Install the `proctor` kernelspec into the environment when it is missing or names another Python,
    then check that Jupyter finds this one under the name (not a user's or a system's `proctor`).

    Returns the kernelspec's folder. Refuses `kernel_not_project` when Jupyter resolves `proctor` to
    another Python (a kernelspec of that name earlier on Jupyter's path, e.g. in ~/.local/share/jupyter).
    """
    folder = _install(prefix)
    from jupyter_client.kernelspec import KernelSpecManager

    found = KernelSpecManager().get_kernel_spec(KERNEL_NAME)
    argv = list(found.argv)
    python = os.path.abspath(argv[0]) if argv else ""
    if python != kernel_spec()["argv"][0]:
        raise NotebookRefusal(Code.KERNEL_NOT_PROJECT,
                              f"Jupyter finds the {KERNEL_NAME!r} kernel at {found.resource_dir}, running {python!r}, "
                              f"not this environment's Python; remove that kernelspec or set JUPYTER_PATH "
                              f"to {os.path.dirname(os.path.dirname(folder))}", found.resource_dir)
    return folder


def lab_env(environ: Mapping[str, str] | None = None, prefix: str | None = None) -> dict[str, str]:
    """The environment `make lab` runs JupyterLab in: the environment's Jupyter folder first on JUPYTER_PATH,
    so that its `proctor` kernelspec wins over any of the same name elsewhere."""
    env = dict(os.environ if environ is None else environ)
    share = os.path.join(prefix or sys.prefix, "share", "jupyter")
    rest = [p for p in env.get("JUPYTER_PATH", "").split(os.pathsep) if p and p != share]
    env["JUPYTER_PATH"] = os.pathsep.join([share, *rest])
    return env


def lab_argv(root: str | os.PathLike[str], *, port: int = 8888, token: str | None = None,
             open_browser: bool = True) -> list[str]:
    """`jupyter lab` on 127.0.0.1:`port` with `root` as its root folder, the `proctor` kernel by default
    (`--allow-root` when run as root, as in a CI container). `token` None keeps Jupyter's own random token
    (printed in its log)."""
    argv = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={os.path.abspath(os.fspath(root))}",
            f"--ServerApp.open_browser={'True' if open_browser else 'False'}",
            f"--MappingKernelManager.default_kernel_name={KERNEL_NAME}"]
    if token is not None:
        argv.append(f"--IdentityProvider.token={token}")
    if os.geteuid() == 0:  # a container's root (CI): Jupyter refuses root without it
        argv.append("--allow-root")
    return argv
