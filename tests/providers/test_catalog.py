"""The model catalog: strict loading, every refusal, `proctor catalog`, and `dispatch --model`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.errors import Refusal
from harness.gate.task import LANES as TASK_LANES
from harness.meter.priced_catalog import cheapest_in_lane
from harness.meter.pricing import load_pricing
from harness.providers.catalog import (
    BUNDLED_CATALOG,
    EXAMPLE_CATALOG,
    LANES,
    catalog_location,
    load_catalog,
    parse_catalog,
    resolve_model,
)
from tests.support.cli import run_proctor
from tests.support.tasks import TaskSetup

SECRET = "sk-planted-7d41c9e0-do-not-print"

GOOD = """\
[[model]]
id = "acme-small"
api_model = "acme/small-2"
provider = "acme"
api_shape = "openai_chat"
base_url = "http://127.0.0.1:9/v1"
base_url_env = "ACME_URL"
credential_env = "ACME_KEY"
pricing_key = "acme-small"
lane = "flash"

[model.worker]
argv = ["{python}", "w.py", "--model", "{model}", "--prompt-file", "{prompt_file}", "--cwd", "{workspace}"]
resume = ["--resume={session}"]
base_url_var = "OPENAI_BASE_URL"

[[model]]
id = "acme-large"
provider = "acme"
api_shape = "anthropic_messages"
base_url = "https://api.acme.example/v1"
credential_env = ""
pricing_key = "acme-large"
lane = "k3"
"""


def write(tmp_path: Path, text: str | bytes, name: str = "catalog.toml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# --- loading -------------------------------------------------------------------------------------


def test_bundled_catalog_lists_the_simulator_systems() -> None:
    catalog = load_catalog(BUNDLED_CATALOG)
    assert [(m.id, m.lane, m.provider) for m in catalog.models] == [
        ("sim-flash", "flash", "sim"),
        ("sim-glm", "glm", "sim"),
        ("sim-k3", "k3", "sim"),
    ]
    for model in catalog.models:
        assert model.api_shape == "openai_chat" and model.credential_env == ""
        assert model.base_url == "http://127.0.0.1:8765/v1" and model.base_url_env == "PROCTOR_SIM_URL"
        assert model.worker is not None
        assert model.worker.render(model=model.id, workspace="/w", prompt_file="/p.md", python="/py") == [
            "/py", "-m", "harness", "worker", "llm-edit", "--model", model.id, "--prompt-file", "/p.md",
        ]
    assert LANES == TASK_LANES


def test_example_catalog_loads_and_its_prices_are_not_invented() -> None:
    catalog = load_catalog(EXAMPLE_CATALOG)
    assert {m.api_shape for m in catalog.models} == {
        "openai_chat", "openai_responses", "anthropic_messages", "gemini_generate",
    }
    assert all(m.credential_env for m in catalog.models)
    bundled = load_pricing()
    assert all(bundled.get(m.pricing_key) is None for m in catalog.models)


def test_a_catalog_is_parsed_with_every_field(tmp_path: Path) -> None:
    catalog = load_catalog(write(tmp_path, GOOD))
    small = resolve_model(catalog, "acme-small")
    assert small.api_model == "acme/small-2" and resolve_model(catalog, "acme-large").api_model == "acme-large"
    assert small.effective_base_url({}) == "http://127.0.0.1:9/v1"
    assert small.effective_base_url({"ACME_URL": "http://127.0.0.1:1/v1"}) == "http://127.0.0.1:1/v1"
    assert small.credential_set({"ACME_KEY": "x"}) is True and small.credential_set({}) is False
    assert resolve_model(catalog, "acme-large").credential_set({}) is None
    assert small.worker is not None
    argv = small.worker.render(model="acme-small", workspace="/ws", prompt_file="/p", python="/py", session="s-1")
    assert argv == ["/py", "w.py", "--model", "acme-small", "--prompt-file", "/p", "--cwd", "/ws", "--resume=s-1"]
    assert catalog.sha256 == __import__("hashlib").sha256(GOOD.encode()).hexdigest()


def test_catalog_location_flag_then_env_then_bundled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROCTOR_CATALOG", raising=False)
    assert catalog_location(None) == (str(BUNDLED_CATALOG), "bundled")
    monkeypatch.setenv("PROCTOR_CATALOG", str(tmp_path / "env.toml"))
    assert catalog_location(None) == (str(tmp_path / "env.toml"), "env")
    assert catalog_location(tmp_path / "flag.toml") == (str(tmp_path / "flag.toml"), "flag")


def _swap(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


ARGV_LINE = 'argv = ["{python}", "w.py", "--model", "{model}", "--prompt-file", "{prompt_file}", "--cwd", "{workspace}"]'

INVALID: dict[str, tuple[str, str]] = {  # case -> (catalog text, a fragment of the refusal message)
    "unknown_top_key": (GOOD + "\n[extra]\nx = 1\n", "unknown top-level keys: extra"),
    "unknown_model_key": (_swap('lane = "flash"', 'lane = "flash"\ncolour = "red"'), "unknown keys: colour"),
    "unknown_worker_key": (
        _swap('base_url_var = "OPENAI_BASE_URL"', 'base_url_var = "OPENAI_BASE_URL"\nshell = true'),
        "worker: unknown keys: shell",
    ),
    "missing_required": (_swap('pricing_key = "acme-small"\n', ""), "pricing_key is required"),
    "lane_wrong_type": (_swap('lane = "flash"', "lane = 3"), "lane must be a non-empty string"),
    "lane_unknown": (_swap('lane = "flash"', 'lane = "turbo"'), "lane 'turbo' is not one of"),
    "shape_unknown": (_swap('api_shape = "openai_chat"', 'api_shape = "openai_completions"'), "api_shape"),
    "base_url_not_http": (_swap('base_url = "http://127.0.0.1:9/v1"', 'base_url = "ftp://x/v1"'), "http://"),
    "duplicate_id": (GOOD.replace('id = "acme-large"', 'id = "acme-small"'), "duplicate id 'acme-small'"),
    "duplicate_key": (_swap('provider = "acme"', 'provider = "acme"\nprovider = "other"'), "not valid TOML"),
    "not_toml": ("[[model]\nid = ", "not valid TOML"),
    "empty": ("", "at least one [[model]]"),
    "model_not_a_table_array": ('model = "x"\n', "at least one [[model]]"),
    "argv_shell_string": (_swap(ARGV_LINE, 'argv = "{python} w.py"'), "shell string"),
    "argv_empty": (_swap(ARGV_LINE, "argv = []"), "must not be empty"),
    "argv_not_strings": (_swap(ARGV_LINE, 'argv = ["x", 1]'), "array of non-empty strings"),
    "unknown_placeholder": (_swap('"{prompt_file}"', '"{promptfile}"'), "unknown placeholder {promptfile}"),
    "session_outside_resume": (_swap('"{prompt_file}"', '"{session}"'), "unknown placeholder {session}"),
    "base_url_env_not_a_name": (_swap('base_url_env = "ACME_URL"', 'base_url_env = "ACME URL"'), "base_url_env"),
    "credential_env_wrong_type": (_swap('credential_env = "ACME_KEY"', "credential_env = false"), "credential_env"),
    "id_with_spaces": (_swap('id = "acme-small"', 'id = "acme small"'), "'acme small'"),
    "worker_not_a_table": (_swap('lane = "k3"', 'lane = "k3"\nworker = 1'), "worker must be a table"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_catalogs_are_refused_with_the_path(tmp_path: Path, case: str) -> None:
    text, fragment = INVALID[case]
    path = write(tmp_path, text)
    with pytest.raises(Refusal) as caught:
        load_catalog(path)
    assert caught.value.code == "catalog_invalid", caught.value.to_json()
    assert caught.value.path == str(path)
    assert fragment in caught.value.message


def test_non_utf8_catalog_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as caught:
        parse_catalog(GOOD.encode() + b"# \xff\n", "x.toml")
    assert caught.value.code == "catalog_invalid" and "UTF-8" in caught.value.message


def test_a_key_pasted_as_credential_env_is_refused_without_echoing_it(tmp_path: Path) -> None:
    path = write(tmp_path, _swap('credential_env = "ACME_KEY"', f'credential_env = "{SECRET}"'))
    with pytest.raises(Refusal) as caught:
        load_catalog(path)
    assert caught.value.code == "catalog_invalid"
    assert SECRET not in json.dumps(caught.value.to_json())


def test_a_fifo_or_missing_catalog_is_a_named_refusal(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(Refusal) as caught:
        load_catalog(fifo)
    assert caught.value.code == "not_a_regular_file"
    with pytest.raises(Refusal) as caught:
        load_catalog(tmp_path / "absent.toml")
    assert caught.value.code == "file_missing"


OTHER = """
[[model]]
id = "other-x"
provider = "other"
api_shape = "gemini_generate"
base_url = "https://other.example/v1beta"
credential_env = "OTHER_KEY"
pricing_key = "other-x"
lane = "glm"
"""


def test_unknown_model_lists_its_family(tmp_path: Path) -> None:
    catalog = load_catalog(write(tmp_path, GOOD + OTHER))
    for asked in ("acme-medium", "acme"):
        with pytest.raises(Refusal) as caught:
            resolve_model(catalog, asked)
        refusal = caught.value.to_json()
        assert refusal["refusal"] == "unknown_model" and refusal["path"] == catalog.path
        assert refusal["family"] == ["acme-small", "acme-large"]
        assert "acme-small" in refusal["message"] and "other-x" not in refusal["message"]
    with pytest.raises(Refusal) as caught:
        resolve_model(catalog, "zzz-1")
    assert caught.value.details["family"] == [] and "other-x" in caught.value.message  # then every known id


def test_auto_picks_the_cheapest_output_price_unpriced_last(tmp_path: Path) -> None:
    bundled = load_catalog(BUNDLED_CATALOG)
    pricing = load_pricing()
    pick, considered = cheapest_in_lane(bundled, "glm", pricing)
    assert pick is not None and pick.id == "sim-glm" and considered[0]["output_per_mtok"] == 2.4
    text = BUNDLED_CATALOG.read_text() + (
        '\n[[model]]\nid = "priced-nowhere"\nprovider = "elsewhere"\napi_shape = "openai_chat"\n'
        'base_url = "http://127.0.0.1:9/v1"\ncredential_env = ""\npricing_key = "nope"\nlane = "glm"\n'
        '[model.worker]\nargv = ["x"]\n'
    )
    two = load_catalog(write(tmp_path, text))
    pick, _ = cheapest_in_lane(two, "glm", pricing)
    assert pick is not None and pick.id == "sim-glm"
    pick, considered = cheapest_in_lane(two, "glm", pricing, ["sim"])
    assert pick is not None and pick.id == "priced-nowhere"
    assert considered[0]["skipped"] == "provider failed in this lane"
    assert cheapest_in_lane(two, "glm", pricing, ["sim", "elsewhere"])[0] is None


# --- proctor catalog -----------------------------------------------------------------------------


def test_proctor_catalog_shows_credential_presence_never_values(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    r = run_proctor("catalog", "--catalog", str(path), env={"ACME_KEY": SECRET})
    assert r.code == 0, r.out
    assert SECRET not in r.stdout and SECRET not in r.stderr
    rows = {m["id"]: m for m in r.out["models"]}
    assert rows["acme-small"]["credential"] == "yes" and rows["acme-small"]["credential_env"] == "ACME_KEY"
    assert rows["acme-large"]["credential"] == "not needed"
    assert rows["acme-small"]["price"] == "unpriced"
    assert r.out["catalog"]["source"] == "flag"

    unset = run_proctor("catalog", "--catalog", str(path))
    assert {m["id"]: m["credential"] for m in unset.out["models"]}["acme-small"] == "no"

    human = __import__("subprocess").run(
        [sys.executable, "-m", "harness", "catalog", "--catalog", str(path)],
        capture_output=True, text=True, env={**os.environ, "ACME_KEY": SECRET}, check=False,
    )
    assert human.returncode == 0 and "acme-small" in human.stdout and SECRET not in human.stdout + human.stderr


def test_proctor_catalog_default_is_the_bundled_one_with_prices(tmp_path: Path) -> None:
    r = run_proctor("catalog")
    assert r.code == 0 and r.out["catalog"]["source"] == "bundled"
    rows = {m["id"]: m for m in r.out["models"]}
    assert rows["sim-flash"]["price"]["output_per_mtok"] == 0.4 and rows["sim-flash"]["price"]["notional"] is True
    assert rows["sim-k3"]["lane"] == "k3" and rows["sim-k3"]["credential"] == "not needed"
    env = run_proctor("catalog", env={"PROCTOR_CATALOG": str(write(tmp_path, GOOD))})
    assert env.out["catalog"]["source"] == "env" and [m["id"] for m in env.out["models"]] == ["acme-small", "acme-large"]


def test_proctor_catalog_refuses_a_bad_catalog_or_pricing(tmp_path: Path) -> None:
    r = run_proctor("catalog", "--catalog", str(write(tmp_path, INVALID["duplicate_id"][0])))
    assert r.code == 3 and r.out["refusal"] == "catalog_invalid"
    r = run_proctor("catalog", "--pricing", str(write(tmp_path, "models: {}\n", "p.yaml")))
    assert r.code == 3 and r.out["refusal"] == "pricing_invalid"


# --- dispatch --model ------------------------------------------------------------------------------

MODEL_WORKER = r"""
import json, os, sys
print("SEEN " + json.dumps({"argv": sys.argv, "env": {k: v for k, v in os.environ.items()
                                         if k.startswith("PROCTOR_") or k in ("OPENAI_BASE_URL", "ACME_URL")},
               "key_present": os.environ.get("ACME_KEY") is not None, "cwd": os.getcwd()}))
"""


def seen_by_worker(out: dict[str, Any]) -> dict[str, Any]:
    """What MODEL_WORKER printed about itself, from the dispatch's output file."""
    lines = Path(out["output_file"]).read_text().splitlines()
    return dict(json.loads(next(line for line in lines if line.startswith("SEEN "))[5:]))


def model_catalog(tmp_path: Path) -> Path:
    script = tmp_path / "model_worker.py"
    script.write_text(MODEL_WORKER)
    text = GOOD.replace('"w.py"', json.dumps(str(script)))
    return write(tmp_path, text, "model-catalog.toml")


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_dispatch_model_runs_the_catalog_worker_behind_the_metering_proxy(
    task_setup: Callable[..., TaskSetup], tmp_path: Path, sandbox: str
) -> None:
    setup = task_setup("wordfreq")
    assert run_proctor("init", *setup.words()).code == 0
    catalog = model_catalog(tmp_path)
    env = {"ACME_KEY": SECRET}
    r = run_proctor("dispatch", *setup.words(), "--model", "acme-small", "--catalog", str(catalog),
                    "--sandbox", sandbox, env=env)  # fmt: skip
    assert r.code == 0, r.out
    assert r.out["model"] == "acme-small" and r.out["wire_log"].endswith("/wire.jsonl")
    seen = seen_by_worker(r.out)
    folder = Path(r.out["output_file"]).parent
    prompt = "/run/proctor/prompt.md" if sandbox == "bwrap" else str(folder / "prompt.md")
    assert seen["argv"][1:] == [
        "--model", "acme-small", "--prompt-file", prompt, "--cwd", os.path.realpath(setup.workspace),
    ]
    assert seen["env"]["PROCTOR_MODEL"] == "acme-small"
    assert seen["env"]["PROCTOR_CATALOG"] == str(catalog)
    assert json.loads(seen["env"]["PROCTOR_SCOPE"]) == ["wordfreq/counter.py"]
    proxy = seen["env"]["OPENAI_BASE_URL"]
    if sandbox == "bwrap":  # no network: the proxy's Unix socket, bound into the sandbox
        assert proxy == "http://localhost/v1"
        assert seen["env"]["PROCTOR_PROXY_SOCKET"] == "/run/proctor/proxy/proxy.sock"
    else:
        assert proxy.startswith("http://127.0.0.1:") and proxy.endswith("/v1") and proxy != "http://127.0.0.1:9/v1"
        assert "PROCTOR_PROXY_SOCKET" not in seen["env"]
    assert seen["env"]["ACME_URL"] == proxy
    assert seen["key_present"] is True

    events = run_proctor("journal", "--workspace", str(setup.workspace)).out["events"]
    start = next(e for e in events if e["event"] == "dispatch_start")
    assert start["model"] == "acme-small" and start["provider"] == "acme" and start["api_model"] == "acme/small-2"
    assert start["wire_log"] == r.out["wire_log"] and start["metering"] == "proxy"
    assert start["upstream"] == "http://127.0.0.1:9/v1"
    assert start["model_choice"]["mode"] == "explicit"
    end = next(e for e in events if e["event"] == "dispatch_end")
    assert end["wire"]["lines"] == 0 and end["wire"]["exchanges"] == 0
    # The credential reaches the worker through its environment, and nothing proctor wrote.
    state = Path(run_proctor("status", "--workspace", str(setup.workspace)).out["state_dir"])
    for path in state.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in r.stdout


def test_dispatch_model_auto_picks_from_the_current_lane(task_setup: Callable[..., TaskSetup], tmp_path: Path) -> None:
    setup = task_setup("wordfreq")
    assert run_proctor("init", *setup.words()).code == 0
    r = run_proctor("dispatch", *setup.words(), "--model", "auto", "--catalog", str(model_catalog(tmp_path)))
    assert r.code == 0, r.out
    assert r.out["model"] == "acme-small" and r.out["lane"] == "flash"
    start = next(e for e in run_proctor("journal", "--workspace", str(setup.workspace)).out["events"]
                 if e["event"] == "dispatch_start")
    assert start["model_choice"]["mode"] == "auto" and start["model_choice"]["lane"] == "flash"


def test_dispatch_model_refusals_and_usage(task_setup: Callable[..., TaskSetup], tmp_path: Path) -> None:
    setup = task_setup("wordfreq")
    assert run_proctor("init", *setup.words()).code == 0
    r = run_proctor("dispatch", *setup.words(), "--model", "sim-flsh")
    assert r.code == 3 and r.out["refusal"] == "unknown_model"
    assert r.out["family"] == ["sim-flash", "sim-glm", "sim-k3"]
    r = run_proctor("dispatch", *setup.words(), "--model", "acme-large", "--catalog", str(model_catalog(tmp_path)))
    assert r.code == 3 and r.out["refusal"] == "model_has_no_worker"
    assert run_proctor("dispatch", *setup.words()).code == 2
    both = run_proctor("dispatch", *setup.words(), "--model", "sim-flash", "--command", "--", "true")
    assert both.code == 2 and both.out["refusal"] == "usage_error"
    events = run_proctor("journal", "--workspace", str(setup.workspace)).out["events"]
    assert not any(e["event"] == "dispatch_start" for e in events)
    assert [e["refusal"] for e in events if e["event"] == "refused"] == ["unknown_model", "model_has_no_worker"]


@pytest.mark.parametrize("nest", [("[", "]"), ("{a = ", "}")])
def test_a_catalog_nested_50000_deep_is_a_named_refusal_not_a_recursion_error(nest: tuple[str, str]) -> None:
    """Issue 14, class 8: it exited 4 (RecursionError); now catalog_invalid naming the file."""
    data = ("x = " + nest[0] * 50_000 + "1" + nest[1] * 50_000 + "\n").encode()
    with pytest.raises(Refusal) as info:
        parse_catalog(data, "deep.toml")
    assert info.value.code == "catalog_invalid" and info.value.path == "deep.toml", info.value.to_json()
    assert "nested too deeply" in info.value.message
