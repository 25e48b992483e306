"""Which systems need a go (`harness.prereg.go.needs_go`): decided by the catalog entry and the URL called."""

from __future__ import annotations

from dataclasses import replace

from harness.prereg.go import needs_go
from harness.providers.catalog import BUNDLED_CATALOG, load_catalog
from tests.support.paths import REPO


def test_the_simulator_and_a_loopback_local_model_need_no_go_every_other_provider_does() -> None:
    bundled = load_catalog(BUNDLED_CATALOG)
    sims = [m for m in bundled.models if m.provider == "sim"]
    assert sims and not any(needs_go(m, "https://anywhere.example/v1") for m in sims)
    assert not needs_go(replace(sims[0], provider="simulator"), "http://10.0.0.9/v1")
    local = load_catalog(REPO / "prereg" / "local-gemma" / "catalog.toml").models[0]
    assert local.provider == "llama-cpp"
    for url in ("http://127.0.0.1:8766/v1", "http://localhost:8766/v1", "http://[::1]:8766/v1"):
        assert not needs_go(local, url), url
    assert needs_go(local, "http://192.168.1.20:8766/v1")  # a model on another machine is not this machine's
    for provider in ("openai", "anthropic", "gemini", "openai-compatible"):
        paid = replace(local, provider=provider)
        assert needs_go(paid, "http://127.0.0.1:8766/v1"), provider  # a loopback proxy to a paid provider is paid
