"""The bwrap sandbox (harness.workers.sandbox): each option that matters, its records and its refusals.

The option tests run a real interpreter under the real bwrap with the
options `Sandbox.wrap` builds and ask it what it can see and do; the rest go
through the real CLI (`run_proctor`): what every dispatch, receipt, accept and
status records, and the refusal where bwrap is missing or cannot run.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.errors import Refusal
from harness.evals.verify_humaneval import VerifierUnavailable, WarmVerifier, verify_response
from harness.evidence.chain_read import read_log
from harness.meter.proxy import start_proxy
from harness.providers.catalog import parse_catalog
from harness.workers.process import run_group
from harness.workers.sandbox import View, resolve_sandbox, sandbox_env
from tests.support.cli import run_proctor
from tests.support.paths import REPO
from tests.support.procs import alive_running, alive_with
from tests.support.sim import SimServer
from tests.support.tasks import TaskSetup

BOX = resolve_sandbox("bwrap")


def inside(code: str, view: View | None = None, given: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `code` (which prints one JSON object) with this interpreter in the sandbox; its answer."""
    cwd = view.cwd if view is not None else "/tmp"
    env = sandbox_env(os.environ, given or {}, sandboxed=True)
    wrapped = BOX.wrap([sys.executable, "-c", textwrap.dedent(code)], view or View(cwd=cwd), env)
    done = subprocess.run(wrapped.argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _wait_gone(token: str, within_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while alive_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive_with(token)


# --- the options, one by one -------------------------------------------------------------------------


def test_its_own_pid_namespace_and_session() -> None:
    seen = inside(f"""
        import json, os
        try:
            os.kill({os.getpid()}, 0)
            host = "reachable"
        except ProcessLookupError:
            host = "not found"
        print(json.dumps({{"pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "host": host,
                          "proc": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}}))
    """)
    assert (seen["pid"], seen["ppid"]) == (2, 1)  # bwrap's init is 1; nothing of the host is there
    assert seen["proc"] == [1, 2] and seen["host"] == "not found"
    assert seen["sid"] == 1  # --new-session: the session bwrap's init made, with no terminal to push input into


def test_no_network_but_its_own_loopback() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        seen = inside(f"""
            import json, socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=5).close()
                tcp = "connected"
            except OSError as exc:
                tcp = type(exc).__name__
            print(json.dumps({{"tcp": tcp, "interfaces": sorted(n for _, n in socket.if_nameindex())}}))
        """)
    assert seen == {"tcp": "ConnectionRefusedError", "interfaces": ["lo"]}


def test_no_capabilities_and_no_namespace_of_its_own() -> None:
    seen = inside("""
        import ctypes, json, os
        caps = dict(line.split(":\\t") for line in open("/proc/self/status").read().splitlines() if line.startswith("Cap"))
        libc = ctypes.CDLL(None, use_errno=True)
        made = libc.unshare(0x10000000)  # CLONE_NEWUSER
        print(json.dumps({"eff": caps["CapEff"].strip(), "bnd": caps["CapBnd"].strip(), "unshare": made,
                          "errno": ctypes.get_errno()}))
    """)
    assert int(seen["eff"], 16) == 0 and int(seen["bnd"], 16) == 0
    if "--disable-userns" in BOX.namespaces:
        assert seen["unshare"] == -1 and seen["errno"] != 0  # it cannot make a user namespace to regain them


def test_the_system_is_read_only_and_tmp_is_private(tmp_path: Path) -> None:
    name = "proctor-sandbox-" + secrets.token_hex(6)
    ws = tmp_path / "ws"
    ws.mkdir()
    host_note = tmp_path / "host-only.txt"
    host_note.write_text("the host's /tmp")
    seen = inside(f"""
        import json, os
        def write(path):
            try:
                with open(path, "w") as fh:
                    fh.write("x")
                return "written"
            except OSError as exc:
                return os.strerror(exc.errno)
        print(json.dumps({{"usr": write("/usr/{name}"), "root": write("/{name}"), "etc": write("/etc/{name}"),
                          "tmp": write("/tmp/{name}"), "ws": write({str(ws / "made")!r}),
                          "host_tmp": os.path.exists({str(host_note)!r})}}))
    """, View(cwd=str(ws), writable=(str(ws),)))
    assert seen == {"usr": "Read-only file system", "root": "Read-only file system", "etc": "Read-only file system",
                    "tmp": "written", "ws": "written", "host_tmp": False}  # fmt: skip
    assert (ws / "made").read_text() == "x"  # the one writable folder is the real one
    assert not Path("/usr", name).exists() and not Path("/tmp", name).exists()  # the rest stayed inside


def test_the_environment_is_only_what_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROCTOR_TEST_SECRET", "sk-never")
    monkeypatch.setenv("SOME_TOKEN", "tok-never")
    seen = inside("import json, os\nprint(json.dumps(dict(os.environ)))", given={"PROCTOR_CHILD": "1"})
    assert "PROCTOR_TEST_SECRET" not in seen and "SOME_TOKEN" not in seen
    assert seen["PROCTOR_CHILD"] == "1" and seen["HOME"] == "/tmp" and seen["TMPDIR"] == "/tmp"
    assert set(seen) <= {"PATH", "LANG", "LANGUAGE", "TERM", "TZ", "HOME", "TMPDIR", "PROCTOR_CHILD", "PWD"} | {
        k for k in seen if k.startswith("LC_")
    }


def test_only_allowed_locale_variables_with_locale_values_get_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 14, class 8: a secret kept in an LC_* variable (a made-up one, or a real one) stays out."""
    monkeypatch.setenv("LC_SECRET_TOKEN", "sk-lc-never")
    monkeypatch.setenv("LC_MESSAGES", "sk-live-abc123 never")
    monkeypatch.setenv("LC_TIME", "/home/someone/.secret")
    monkeypatch.setenv("LANGUAGE", "en_US:de$(touch x)")
    monkeypatch.setenv("LC_NUMERIC", "de_DE.UTF-8@euro")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("TERM", "xterm 256color secret")
    seen = inside("import json, os\nprint(json.dumps(dict(os.environ)))")
    for name in ("LC_SECRET_TOKEN", "LC_MESSAGES", "LC_TIME", "LANGUAGE", "TERM"):
        assert name not in seen, (name, seen.get(name))
    assert seen["LC_NUMERIC"] == "de_DE.UTF-8@euro" and seen["LANG"] == "C.UTF-8"
    assert not any("never" in v or "secret" in v for v in seen.values()), seen


@pytest.mark.skipif(not os.path.isfile("/etc/shadow"), reason="this host has no /etc/shadow to mask")
def test_etc_secrets_are_masked() -> None:
    seen = inside("""
        import json, os
        try:
            shadow = open("/etc/shadow").read()
        except OSError as exc:
            shadow = type(exc).__name__
        print(json.dumps({"shadow": shadow, "passwd": os.path.getsize("/etc/passwd") > 0}))
    """)
    # /dev/null bound over it: empty, or (in a user namespace, where device nodes are refused) unreadable
    assert seen["shadow"] in ("", "PermissionError") and seen["passwd"] is True


def test_a_withheld_path_is_not_there_even_beneath_a_readable_folder(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "lib").mkdir(parents=True)
    (shared / "lib" / "tool.py").write_text("TOOL = 1\n")
    (shared / "task" / "hidden").mkdir(parents=True)
    (shared / "task" / "hidden" / "test_hidden.py").write_text("SECRET = 1\n")
    (shared / "task" / "fix.py").write_text("FIX = 1\n")
    (shared / "state").mkdir()
    (shared / "state" / "pin.json").write_text("{}")
    view = View(cwd="/tmp", readable=(str(shared), str(shared / "state" / "pin.json")),
                withheld=(str(shared / "task" / "hidden" / "test_hidden.py"), str(shared / "state")))  # fmt: skip
    seen = inside(f"""
        import json, os
        root = {str(shared)!r}
        print(json.dumps({{"top": sorted(os.listdir(root)), "task": sorted(os.listdir(root + "/task")),
                          "hidden": sorted(os.listdir(root + "/task/hidden")),
                          "tool": open(root + "/lib/tool.py").read(), "fix": open(root + "/task/fix.py").read()}}))
    """, view)
    assert seen == {"top": ["lib", "task"], "task": ["fix.py", "hidden"], "hidden": [], "tool": "TOOL = 1\n",
                    "fix": "FIX = 1\n"}  # fmt: skip


def test_naming_the_root_exposes_nothing_and_a_withheld_system_file_is_masked() -> None:
    data = REPO / "harness" / "data"  # inside the installed package, which is always there
    view = View(cwd="/tmp", readable=("/",), withheld=(str(data / "pricing.yaml"), str(data / "nothing-here")))
    seen = inside(f"""
        import json, os
        try:
            masked = open({str(data / "pricing.yaml")!r}).read()
        except OSError as exc:
            masked = type(exc).__name__
        print(json.dumps({{"evals": os.path.exists({str(REPO / "evals")!r}), "masked": masked,
                          "catalog": os.path.getsize({str(data / "catalog.toml")!r}) > 0}}))
    """, view)
    assert seen["evals"] is False and seen["catalog"] is True
    assert seen["masked"] in ("", "PermissionError")


def test_it_dies_with_its_parent(tmp_path: Path) -> None:
    token = "token-" + secrets.token_hex(8)
    env = sandbox_env(os.environ, {}, sandboxed=True)
    inner = [sys.executable, "-c", "import time; time.sleep(120)", token]
    wrapped = BOX.wrap(inner, View(cwd="/tmp"), env)
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess; subprocess.run({wrapped.argv!r})"], env=env)
    try:
        # wait for the sandboxed program itself: the parent and bwrap name the token too, and a parent killed
        # before bwrap has set its parent-death signal would leave bwrap running (a race, not a leak)
        deadline = time.monotonic() + 20
        while not alive_running(inner) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive_running(inner), "the sandboxed process did not start"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        assert _wait_gone(token) == []
    finally:
        parent.kill()
        parent.wait()


def test_at_the_deadline_the_whole_sandbox_is_stopped(tmp_path: Path) -> None:
    token = "token-" + secrets.token_hex(8)
    code = textwrap.dedent(f"""
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        time.sleep(120)
        # {token}
    """)
    env = sandbox_env(os.environ, {}, sandboxed=True)
    wrapped = BOX.wrap([sys.executable, "-c", code], View(cwd="/tmp"), env)
    result = run_group(wrapped.argv, cwd="/tmp", env=env, timeout_s=1, output_path=str(tmp_path / "out"),
                       sandboxed=True)  # fmt: skip
    assert result.timed_out and result.exit_code != 0
    assert result.detached_pids == ()  # the namespace went with its init: nothing outlived it
    assert alive_with(token) == []


def test_the_record_names_the_exact_options_and_never_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACME_KEY", "sk-record-never")
    env = sandbox_env(os.environ, {"ACME_KEY": "sk-record-never"}, sandboxed=True)
    wrapped = BOX.wrap(["python3", "-V"], View(cwd="/tmp"), env)
    record = wrapped.record
    assert wrapped.argv == [BOX.binary, *record["options"], "--", "python3", "-V"]
    assert record["kind"] == "bwrap" and record["guarantee"] == "sandboxed"
    version = subprocess.run([str(BOX.binary), "--version"], capture_output=True, text=True, check=True).stdout
    assert record["version"] == version.split()[-1]
    for option in ("--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "--clearenv"):
        assert (option in record["options"]) is (option != "--clearenv")  # the environment is built, not set
    assert record["options"][-4:] == ["--remount-ro", "/", "--chdir", "/tmp"]
    assert "ACME_KEY" in record["env"] and "sk-record-never" not in json.dumps(record)
    none = resolve_sandbox("none").wrap(["python3", "-V"], View(cwd="/tmp"), env)
    assert none.argv == ["python3", "-V"] and none.record["kind"] == "none" and none.record["guarantee"] == "weaker"


# --- refusals ------------------------------------------------------------------------------------------


def _init(ts: TaskSetup) -> Path:
    r = run_proctor("init", *ts.words())
    assert r.code == 0, r.out
    return Path(r.out["state_dir"])


def test_a_missing_bwrap_is_refused_unless_sandbox_none(task_setup: Any, tmp_path: Path) -> None:
    ts = task_setup("wordfreq")
    state = _init(ts)
    missing = str(tmp_path / "no-such-bwrap")
    env = {"PROCTOR_BWRAP": missing}
    for words in (["dispatch", *ts.words(), "--command", "--", *ts.worker()], ["verify", *ts.words()]):
        r = run_proctor(*words, env=env)
        assert r.code == 3 and r.out["refusal"] == "sandbox_unavailable", r.out
        assert r.out["path"] == missing and "does not exist" in r.out["message"] and "--sandbox none" in r.out["message"]
    events = read_log(state / "journal.jsonl")
    assert [(e["event"], e.get("refusal")) for e in events[-2:]] == [("refused", "sandbox_unavailable")] * 2
    assert not any(e["event"] == "dispatch_start" for e in events)

    # --sandbox none runs, and every record says it is the weaker guarantee.
    d = run_proctor("dispatch", *ts.words(), "--sandbox", "none", "--command", "--", *ts.worker(), env=env)
    assert d.code == 0 and d.out["sandbox"]["kind"] == "none" and d.out["sandbox"]["guarantee"] == "weaker", d.out
    v = run_proctor("verify", *ts.words(), "--sandbox", "none", env=env)
    assert v.code == 0 and v.out["sandbox"]["kind"] == "none", v.out
    receipt = json.loads(Path(v.out["receipt_path"]).read_text())
    assert receipt["sandbox"] == {**receipt["sandbox"], "kind": "none", "version": None, "guarantee": "weaker"}
    a = run_proctor("accept", *ts.words(), env=env)
    assert a.code == 0 and a.out["sandbox"]["guarantee"] == "weaker", a.out
    assert "without a sandbox" in a.out["sandbox"]["note"]
    st = run_proctor("status", "--workspace", str(ts.workspace)).out
    assert st["sandbox"] == {"dispatches": {d.out["dispatch_id"]: "none"}, "last_receipt": "none",
                             "guarantee": "weaker"}  # fmt: skip
    assert read_log(state / "journal.jsonl")[-1]["guarantee"] == "weaker"


def test_bwrap_not_on_path_is_refused_and_a_bwrap_that_cannot_run_too(task_setup: Any, tmp_path: Path) -> None:
    ts = task_setup("wordfreq")
    _init(ts)
    bin_dir = tmp_path / "bin"  # git and nothing else: a PATH without bwrap
    bin_dir.mkdir()
    git = shutil.which("git")
    assert git is not None
    (bin_dir / "git").symlink_to(git)
    r = run_proctor("verify", *ts.words(), env={"PATH": str(bin_dir)})
    assert r.code == 3 and r.out["refusal"] == "sandbox_unavailable", r.out
    assert "not found on PATH" in r.out["message"] and r.out["path_searched"] == str(bin_dir)
    # A real binary that cannot make a sandbox: `false` as bwrap.
    false = shutil.which("false")
    assert false is not None
    r = run_proctor("verify", *ts.words(), env={"PROCTOR_BWRAP": false})
    assert r.code == 3 and r.out["refusal"] == "sandbox_unavailable" and "cannot make a sandbox" in r.out["message"]
    r = run_proctor("evals", "verify", "--item", "HumanEval/0", "--response", str(ts.task), env={"PROCTOR_BWRAP": false})
    assert r.code == 3 and r.out["refusal"] == "sandbox_unavailable", r.out
    # The study runner's warm verifiers too: refused before the stage starts.
    r = run_proctor("run", str(REPO / "prereg" / "demo"), "--stage", "A", "--results", str(tmp_path / "results"),
                    "--sandbox", "bwrap", env={"PROCTOR_BWRAP": false})  # fmt: skip
    assert r.code == 3 and r.out["refusal"] == "sandbox_unavailable", r.out
    assert not (tmp_path / "results").exists()


def test_an_unknown_sandbox_kind_is_refused(task_setup: Any) -> None:
    ts = task_setup("wordfreq")
    _init(ts)
    r = run_proctor("verify", *ts.words(), env={"PROCTOR_SANDBOX": "chroot"})
    assert r.code == 3 and r.out["refusal"] == "sandbox_invalid" and "PROCTOR_SANDBOX" in r.out["message"], r.out
    r = run_proctor("verify", *ts.words(), "--sandbox", "chroot")
    assert r.code == 2 and r.out["refusal"] == "usage_error"
    with pytest.raises(Refusal) as caught:
        resolve_sandbox("firejail")
    assert caught.value.code == "sandbox_invalid"


# --- records through the gated path ---------------------------------------------------------------------


def test_the_gated_path_records_its_sandbox_everywhere(task_setup: Any) -> None:
    ts = task_setup("wordfreq")
    state = _init(ts)
    d = run_proctor("dispatch", *ts.words(), "--command", "--", *ts.worker())
    assert d.code == 0, d.out
    start = next(e for e in read_log(state / "journal.jsonl") if e["event"] == "dispatch_start")
    assert start["sandbox"] == d.out["sandbox"] and start["sandbox"]["kind"] == "bwrap"
    options = start["sandbox"]["options"]
    assert ["--bind", str(ts.workspace), str(ts.workspace)] == options[options.index("--bind"):][:3]
    assert str(state) in start["sandbox"]["withheld"]
    assert str((ts.root / "task" / "hidden" / "test_hidden.py").resolve()) in start["sandbox"]["withheld"]
    v = run_proctor("verify", *ts.words())
    assert v.code == 0, v.out
    receipt = json.loads(Path(v.out["receipt_path"]).read_text())
    assert receipt["sandbox"]["kind"] == "bwrap" and receipt["sandbox"]["version"] == start["sandbox"]["version"]
    copy = [o for o in receipt["sandbox"]["options"] if o.endswith("/tree")]
    assert copy and all("/verify/r0001/tree" in o for o in copy)  # the copy is its one writable folder
    a = run_proctor("accept", *ts.words())
    assert a.code == 0 and a.out["sandbox"] == {"verify": "bwrap", "dispatches": {d.out["dispatch_id"]: "bwrap"},
                                                "guarantee": "sandboxed"}  # fmt: skip
    st = run_proctor("status", "--workspace", str(ts.workspace)).out
    assert st["sandbox"]["guarantee"] == "sandboxed" and st["last_receipt"]["sandbox"] == "bwrap"


def test_a_sandboxed_worker_dies_with_its_proctor_and_is_reported_orphaned(task_setup: Any, tmp_path: Path) -> None:
    ts = task_setup("wordfreq")
    _init(ts)
    token = "token-" + secrets.token_hex(8)
    argv = [sys.executable, "-c", "import json, os, time\n"
            "open(os.environ['PROCTOR_HEARTBEAT'], 'w').write(json.dumps({'stage': 'waiting'}))\ntime.sleep(120)",
            token]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROCTOR_")}
    proctor = subprocess.Popen([sys.executable, "-m", "harness", "dispatch", *ts.words(), "--json", "--command", "--",
                                *argv], env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        running: list[str] = []
        while time.monotonic() < deadline and not running:
            report = run_proctor("status", "--workspace", str(ts.workspace)).out
            ids = report["running_dispatch_ids"]
            running = [i for i in ids if report["payload_progress"][i].get("stage") == "waiting"]
            time.sleep(0.1)
        assert running and alive_with(token), "the sandboxed worker did not start"
        proctor.send_signal(signal.SIGKILL)
        proctor.wait()
        assert _wait_gone(token) == []  # --die-with-parent: no worker outlives its proctor
        st = run_proctor("status", "--workspace", str(ts.workspace)).out
        assert st["orphaned_dispatch_ids"] == running
    finally:
        proctor.kill()
        proctor.wait()


# --- models: the proxy's Unix socket, and workers with no network ------------------------------------------


def test_the_proxy_also_listens_on_a_private_unix_socket(sim_server: SimServer, tmp_path: Path) -> None:
    url = sim_server()
    sock = tmp_path / "p" / "proxy.sock"
    sock.parent.mkdir()
    out = tmp_path / "wire.jsonl"
    body = {"model": "sim-flash", "messages": [{"role": "user", "content": "Say hello."}]}
    with start_proxy(url, out, name="uds", unix_socket=str(sock)) as proxy:
        assert proxy.socket == str(sock) and oct(sock.stat().st_mode & 0o777) == oct(0o600)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as client:
            assert client.post("http://ignored/v1/chat/completions", json=body, timeout=30).status_code == 200
        assert httpx.post(proxy.url + "/chat/completions", json=body, timeout=30).status_code == 200
        assert (proxy.exchanges, proxy.wire_lines, proxy.wire_interleaved) == (2, 2, 0)
        summary = proxy.summary()
    assert summary["socket"] == str(sock) and not sock.exists()  # removed at close
    assert [line["via"] for line in read_log(out)] == ["proxy", "proxy"]


def test_a_model_dispatch_in_the_sandbox_reaches_only_the_proxy(task_setup: Any, sim_server: SimServer) -> None:
    ts = task_setup("intervals")
    _init(ts)
    env = {"PROCTOR_SIM_URL": sim_server()}
    d = run_proctor("dispatch", *ts.words(), "--model", "sim-flash", env=env)
    assert d.code == 0, d.out
    record = d.out["sandbox"]
    assert record["kind"] == "bwrap" and "--unshare-all" in record["options"] and "PROCTOR_PROXY_SOCKET" in record["env"]
    at = record["options"].index("/run/proctor/proxy")
    assert record["options"][at - 2] == "--ro-bind" and record["options"][at - 1].endswith("proctor-proxy-" +
                                                                                          record["options"][at - 1][-8:])
    wire = read_log(d.out["wire_log"])
    assert len(wire) == 1 and wire[0]["status"] == 200  # the one exchange it made went through the proxy


def test_a_worker_with_network_none_gets_no_proxy(task_setup: Any, tmp_path: Path) -> None:
    ts = task_setup("wordfreq")
    _init(ts)
    script = tmp_path / "offline.py"
    script.write_text("import json, os\nprint('SEEN ' + json.dumps(sorted(os.environ)))\n")
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(f"""[[model]]
id = "local-offline"
provider = "local"
api_shape = "openai_chat"
base_url = "http://127.0.0.1:9/v1"
credential_env = ""
pricing_key = "local-offline"
lane = "flash"

[model.worker]
argv = ["{{python}}", {json.dumps(str(script))}]
network = "none"
""")
    d = run_proctor("dispatch", *ts.words(), "--model", "local-offline", "--catalog", str(catalog))
    assert d.code == 0 and d.out["wire_log"] is None, d.out
    seen = json.loads(Path(d.out["output_file"]).read_text().split("SEEN ", 1)[1])
    assert "PROCTOR_PROXY_SOCKET" not in seen and "PROCTOR_MODEL" in seen
    row = run_proctor("record", *ts.words(), "--catalog", str(catalog)).out
    assert row["metering"] == "flat_rate", row
    with pytest.raises(Refusal) as caught:
        parse_catalog(catalog.read_bytes().replace(b'network = "none"', b'network = "open"'), str(catalog))
    assert caught.value.code == "catalog_invalid" and "network" in caught.value.message


# --- the warm HumanEval verifier -------------------------------------------------------------------------


PROMPT = 'def f():\n    """Return one."""\n'


def test_the_warm_verifier_runs_sandboxed_and_its_receipts_say_so() -> None:
    checks = f"""
import os, socket
assert os.getpid() < 10, os.getpid()
assert not os.path.exists({str(REPO / "evals")!r})
try:
    socket.create_connection(("127.0.0.1", 22), timeout=2)
    raise SystemExit("network")
except OSError:
    pass
"""
    with WarmVerifier() as verifier:
        assert verifier.run(checks).passed
        verdict, receipt = verify_response(
            verifier, suite="s", item="i", prompt=PROMPT, entry_point="f", test="def check(c):\n    assert c() == 1\n",
            response_text="def f():\n    return 1\n",
        )  # fmt: skip
    assert verdict.passed and receipt["sandbox"]["kind"] == "bwrap" and "--unshare-all" in receipt["sandbox"]["options"]
    with WarmVerifier(sandbox="none") as plain:
        _, receipt = verify_response(plain, suite="s", item="i", prompt=PROMPT, entry_point="f",
                                     test="def check(c):\n    pass\n", response_text="def f():\n    return 1\n")  # fmt: skip
    assert receipt["sandbox"]["kind"] == "none" and receipt["sandbox"]["guarantee"] == "weaker"


def test_a_warm_verifier_without_bwrap_is_unavailable_not_a_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROCTOR_BWRAP", str(tmp_path / "no-bwrap"))
    with pytest.raises(VerifierUnavailable, match="sandbox_unavailable"), WarmVerifier() as verifier:
        verifier.run("pass")


def test_python_is_bound_after_the_private_tmp_so_a_checkout_under_tmp_stays_visible() -> None:
    from harness.workers import sandbox

    options = list(sandbox._base_options())
    tmpfs = next(i for i in range(len(options) - 1) if options[i:i + 2] == ["--tmpfs", "/tmp"])
    roots = sandbox._python_roots()
    assert roots, "the harness package and the Python prefixes are bound"
    for root in roots:
        binds = [i for i in range(len(options) - 2) if options[i:i + 3] == ["--ro-bind", root, root]]
        assert binds and all(i > tmpfs for i in binds), (root, options)
