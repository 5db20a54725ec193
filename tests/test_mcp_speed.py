"""The stdio start-up shortcuts keep the server's behaviour: lazy tools, the listing cache, template cache."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from inferwise.server import mcp_server, mcp_tool_cache
from inferwise.server.registry import BY_TOOL

FIT = {"model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": "h100-sxm-80gb"}


@pytest.fixture(autouse=True)
def _fresh_template_environment():
    """The jinja environment (and its cache directory) is made once per process."""
    from inferwise.server import render

    render.environment.cache_clear()
    yield
    render.environment.cache_clear()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("INFERWISE_CACHE_DIR", str(folder))
    monkeypatch.setenv("INFERWISE_DB", str(tmp_path / "runs.db"))
    return folder


def _session(server, *steps, mode="legacy"):
    """Run (method, args) steps in one in-memory client session; return their results."""
    from mcp.client import Client

    async def go():
        out = []
        async with Client(server, mode=mode) as client:
            for method, args in steps:
                if method == "list":
                    out.append(
                        [
                            t.model_dump(mode="json", by_alias=True)
                            for t in (await client.list_tools()).tools
                        ]
                    )
                else:
                    out.append(await client.call_tool(method, args))
        return out

    return asyncio.run(go())


def test_lazy_listing_equals_the_eager_one_before_and_after_it_is_cached(cache) -> None:
    (eager,) = _session(mcp_server.build_server(), ("list", None))
    (first,) = _session(mcp_server.build_server(lazy_tools=True), ("list", None))
    assert list(cache.glob("mcp-tools-*.json")), "the first lazy listing is stored"
    (cached,) = _session(mcp_server.build_server(lazy_tools=True), ("list", None))
    assert first == eager
    assert cached == eager
    assert [t["name"] for t in cached] == [t["name"] for t in eager]


def test_a_stored_listing_is_used_only_for_its_own_fingerprint(cache, monkeypatch) -> None:
    (real,) = _session(mcp_server.build_server(), ("list", None))
    key = mcp_tool_cache.fingerprint()
    doctored = [dict(real[0], description="from the cache")]
    mcp_tool_cache.store(key, doctored)
    (listed,) = _session(mcp_server.build_server(lazy_tools=True), ("list", None))
    assert [t["description"] for t in listed] == ["from the cache"]  # the cache is what answered

    monkeypatch.setattr(mcp_tool_cache, "fingerprint", lambda: "0" * 64)  # the source changed
    (rebuilt,) = _session(mcp_server.build_server(lazy_tools=True), ("list", None))
    assert rebuilt == real
    assert mcp_tool_cache.load(key) is None, "listings of older fingerprints are dropped"


def test_the_fingerprint_changes_when_a_package_file_changes(tmp_path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"ignored")
    before: list[str] = []
    mcp_tool_cache._stat_tree(str(tmp_path), before)
    assert len(before) == 1  # compiled files do not count
    (tmp_path / "a.py").write_text("x = 22\n")
    after: list[str] = []
    mcp_tool_cache._stat_tree(str(tmp_path), after)
    assert before != after
    assert mcp_tool_cache.fingerprint() == mcp_tool_cache.fingerprint()


@pytest.mark.parametrize("where", ["", "file"])
def test_no_usable_cache_directory_still_serves_and_renders(tmp_path, monkeypatch, where) -> None:
    if where == "file":  # a path that cannot be a directory
        blocker = tmp_path / "blocker"
        blocker.write_text("")
        where = str(blocker / "cache")
    monkeypatch.setenv("INFERWISE_CACHE_DIR", where)
    (eager,) = _session(mcp_server.build_server(), ("list", None))
    listed, result = _session(
        mcp_server.build_server(lazy_tools=True), ("list", None), ("estimate_memory_fit", FIT)
    )
    assert listed == eager
    assert not result.is_error
    assert result.content[0].text.startswith("## Memory fit")


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_lazy_tools_answer_and_refuse_like_eager_ones(cache, mode) -> None:
    steps = [
        ("estimate_memory_fit", FIT),
        ("estimate_memory_fit", {**FIT, "tensor_parallel_size": 3}),
        ("no_such_tool", {}),
    ]
    eager = _session(mcp_server.build_server(), *steps, mode=mode)
    lazy = _session(mcp_server.build_server(lazy_tools=True), *steps, mode=mode)
    for a, b in zip(eager, lazy, strict=True):
        assert a.is_error == b.is_error
        assert a.structured_content == b.structured_content
        assert [c.text for c in a.content] == [c.text for c in b.content]
    assert lazy[0].is_error is False
    assert lazy[1].is_error and "tensor_parallel_size" in lazy[1].content[0].text


def test_a_session_that_only_sizes_imports_no_other_operation(cache) -> None:
    """What the lazy start-up is for: with the listing cached, tools/list and a fit
    load neither diagnosis, planning nor the probe (checked in a fresh interpreter)."""
    _session(mcp_server.build_server(lazy_tools=True), ("list", None))  # fills the cache
    script = f"""
import asyncio, json, sys
from mcp.client import Client
from inferwise.server import mcp_server
async def go(server):
    async with Client(server, mode="legacy") as client:
        assert len((await client.list_tools()).tools) == {len(BY_TOOL)}
        r = await client.call_tool("estimate_memory_fit", {json.dumps(FIT)})
        assert not r.is_error
asyncio.run(go(mcp_server.build_server(lazy_tools=True)))
print(json.dumps(sorted(m for m in sys.modules if m.startswith("inferwise."))))
"""
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    loaded = set(json.loads(run.stdout))
    assert "inferwise.calculators.fit" in loaded
    assert (
        not {
            "inferwise.knowledge.planning",
            "inferwise.knowledge.diagnosis",
            "inferwise.probes.runner",
        }
        & loaded
    )


def test_compiled_templates_are_cached_and_render_the_same(cache) -> None:
    from inferwise.calculators.fit import FitRequest, estimate_fit
    from inferwise.server import render

    result = estimate_fit(FitRequest(**FIT))
    first = render.render("fit.md.j2", result)
    assert list((cache / "templates").iterdir()), "the compiled template is stored"
    render.environment.cache_clear()
    second = render.render("fit.md.j2", result)  # loaded from the bytecode cache
    assert first == second
