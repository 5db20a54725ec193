"""Models from the Hugging Face Hub, against a stand-in Hub on 127.0.0.1: resolution,
caching, offline use, revisions, gated and missing repositories, no weights downloaded,
and the token never anywhere but the Authorization header."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hub_standin import HubStandin

from inferwise.calculators import hub
from inferwise.calculators.catalog import load_model
from inferwise.calculators.errors import InputError
from inferwise.calculators.fit import FitRequest, estimate_fit

TOKEN = "hf_" + "x7" * 17
COMMIT = "c0ffee" + "0" * 34
LLAMA = dict(load_model("meta-llama/Llama-3.1-8B-Instruct").config)
MISTRAL_SMALL = {  # the shape of mistralai/Mistral-Small-24B-Instruct-2501's config.json
    **LLAMA,
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 5120,
    "intermediate_size": 32768,
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 131072,
    "max_position_embeddings": 32768,
    "rope_scaling": None,
    "sliding_window": None,
}
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def mistral_small_tensors() -> dict[str, dict]:
    """Every tensor of a Mistral-Small-24B checkpoint (bf16), named as transformers saves them."""
    c = MISTRAL_SMALL
    h, kv, q = c["hidden_size"], c["num_key_value_heads"] * 128, c["num_attention_heads"] * 128
    out = {"model.embed_tokens.weight": [c["vocab_size"], h]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {
            p + "self_attn.q_proj.weight": [q, h],
            p + "self_attn.k_proj.weight": [kv, h],
            p + "self_attn.v_proj.weight": [kv, h],
            p + "self_attn.o_proj.weight": [h, q],
            p + "mlp.gate_proj.weight": [c["intermediate_size"], h],
            p + "mlp.up_proj.weight": [c["intermediate_size"], h],
            p + "mlp.down_proj.weight": [h, c["intermediate_size"]],
            p + "input_layernorm.weight": [h],
            p + "post_attention_layernorm.weight": [h],
        }
    out |= {"model.norm.weight": [h], "lm_head.weight": [c["vocab_size"], h]}
    return {name: {"dtype": "BF16", "shape": shape} for name, shape in out.items()}


def safetensors_header(tensors: dict) -> bytes:
    """The first bytes of a safetensors file: the header length, then the JSON header (the
    tensor data is never read, so the stand-in serves only this)."""
    offset, header = 0, {}
    for name, t in tensors.items():
        size = 2 * math.prod(t["shape"])
        header[name] = {**t, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw


TENSORS = mistral_small_tensors()
HEADER_BYTES = sum(2 * math.prod(t["shape"]) for t in TENSORS.values())
HALF = len(TENSORS) // 2
SHARD_TENSORS = (dict(list(TENSORS.items())[:HALF]), dict(list(TENSORS.items())[HALF:]))
INDEX = {
    "metadata": {"total_size": HEADER_BYTES},
    "weight_map": {name: SHARDS[0] if i < HALF else SHARDS[1] for i, name in enumerate(TENSORS)},
}
REPOS = {
    "acme/Small-24B": {
        "files": {
            "config.json": json.dumps(MISTRAL_SMALL).encode(),
            "model.safetensors.index.json": json.dumps(INDEX).encode(),
            SHARDS[0]: safetensors_header(SHARD_TENSORS[0]),
            SHARDS[1]: safetensors_header(SHARD_TENSORS[1]),
        },
        "commit": COMMIT,
    },
    "acme/Gated-8B": {"files": {"config.json": json.dumps(LLAMA).encode()}, "gated": True},
    "meta-llama/Llama-3.1-8B-Instruct": {
        "files": {"config.json": json.dumps(LLAMA).encode()},
        "gated": True,
    },
}


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    with HubStandin(REPOS, token=TOKEN) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("INFERWISE_HUB", raising=False)
        hub.forget()
        yield server
    hub.forget()


def fit(model: str, **kw) -> object:
    return estimate_fit(FitRequest(model=model, gpu="h100", max_model_len=8192, **kw))


def test_a_model_outside_the_catalog_is_read_from_the_hub_and_cached(stand_in, monkeypatch):
    first = fit("acme/Small-24B")
    assert first.model_source == "hub" and first.model_revision == COMMIT
    # the checkpoint's own headers, read by range requests, are the measured size
    assert first.checkpoint_bytes == HEADER_BYTES
    assert any("acme/Small-24B@" + COMMIT in a for a in first.assumptions)
    assert any("safetensors headers: 23,572,403,200 BF16" in a for a in first.assumptions)
    assert any(
        q.name == "weights_gib" and q.detail.startswith("measured from the checkpoint's headers")
        for q in first.quantities
    )
    # the header table and the config arithmetic agree for a plain bf16 checkpoint
    assert first.weights_bytes_total == HEADER_BYTES
    assert first.parameters.total > 20e9  # a 24B model, from its config
    # read and normalised once: later calls share it (as catalog entries are shared)
    assert load_model("acme/Small-24B", fresh=False) is load_model("acme/Small-24B", fresh=False)
    # a second process-level lookup, offline: the Hub cache answers, tensor table included
    hub.forget()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    again = fit("acme/Small-24B")
    assert again.model_revision == COMMIT and again.kv_cache_tokens == first.kv_cache_tokens
    assert any("local Hub cache" in a for a in again.assumptions)
    assert again.checkpoint_bytes == HEADER_BYTES
    assert stand_in.refused == []  # no weight file was downloaded whole
    shard_gets = [r for r in stand_in.requests if r.path.endswith(".safetensors")]
    assert shard_gets and all("range" in r.headers for r in shard_gets if r.method == "GET")


def test_a_revision_is_pinned_and_a_bad_one_names_the_flag(stand_in):
    assert fit("acme/Small-24B", revision=COMMIT).model_revision == COMMIT
    with pytest.raises(InputError) as err:
        fit("acme/Small-24B", revision="no-such-branch")
    assert err.value.field == "revision" and "no-such-branch" in err.value.message


def test_gated_and_missing_repositories_are_input_errors_that_say_what_to_do(stand_in, monkeypatch):
    with pytest.raises(InputError) as gated:
        fit("acme/Gated-8B")
    assert "HF_TOKEN" in gated.value.message
    assert f"{stand_in.endpoint}/acme/Gated-8B" in gated.value.message
    with pytest.raises(InputError) as missing:
        fit("acme/No-Such-Model")
    assert "no model 'acme/No-Such-Model'" in missing.value.message
    hub.forget()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    ok = fit("acme/Gated-8B")
    assert ok.model_source == "hub"
    assert TOKEN not in ok.model_dump_json()
    assert stand_in.leaks(TOKEN) == []  # only ever in the Authorization header


def test_a_gated_catalog_model_without_a_token_uses_the_catalog_and_says_so(stand_in):
    result = fit("meta-llama/Llama-3.1-8B-Instruct")
    assert result.model_source == "catalog"
    assert any("catalog's copy" in a and "gated" in a for a in result.assumptions)


def test_an_unreachable_hub_falls_back_to_the_catalog_quickly(tmp_path, monkeypatch):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("INFERWISE_HUB", raising=False)
    hub.forget()
    t0 = time.monotonic()
    result = fit("Qwen/Qwen2.5-7B-Instruct")
    assert time.monotonic() - t0 < 5
    assert result.model_source == "catalog"
    assert any("could not be reached" in a for a in result.assumptions)
    with pytest.raises(InputError, match="could not be reached"):
        fit("acme/Small-24B")
    # within the pause only the cache is read: an MCP fit may run on the event loop again
    assert not hub.may_reach_network("acme/Small-24B")
    hub.forget()


def test_the_cli_says_gated_in_one_line_and_exits_2(stand_in, tmp_path):
    import os

    env = {**os.environ}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "inferwise.server",
            "fit",
            "--model",
            "acme/Gated-8B",
            "--gpu",
            "h100",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert p.returncode == 2
    assert p.stderr.count("\n") == 1 and "HF_TOKEN" in p.stderr


def test_the_mcp_server_keeps_a_first_hub_lookup_off_its_event_loop(stand_in) -> None:
    """A fit is fast enough to run on the event loop, but not while its model may still
    have to be fetched: then it runs on a worker thread."""
    from inferwise.server.mcp_server import _may_fetch

    req = FitRequest(model="acme/Small-24B", gpu="h100")
    assert _may_fetch(req)
    fit("acme/Small-24B")
    assert not _may_fetch(req)  # resolved in this process: inline again


def test_an_unreachable_hub_is_asked_again_after_the_pause(tmp_path, monkeypatch) -> None:
    """'Not reachable' is not remembered for ever: once the pause has passed, the same Hub
    is asked again and its answer used."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("INFERWISE_HUB", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hub.forget()
    server = HubStandin(REPOS, token=TOKEN)
    server.start()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    server.stop()  # the Hub goes away
    assert hub.fetch("acme/Small-24B") is None
    server.start()  # and comes back, at the same address
    try:
        monkeypatch.setattr(hub, "_unreachable_until", 0.0)  # the pause is over
        files = hub.fetch("acme/Small-24B")
        assert files is not None and files.commit == COMMIT
    finally:
        server.stop()
        hub.forget()
