"""kb search / kb show: ranking on realistic questions, hostile input, the CLI contract."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from inferwise.calculators.errors import InputError
from inferwise.knowledge import kb
from inferwise.server.cli import main


def _top(query: str, n: int = 1, **kw) -> list[str]:
    return [h.id for h in kb.search(kb.SearchRequest(query=query, limit=max(n, 1), **kw)).hits][:n]


@pytest.mark.parametrize(
    "query, expected",
    [
        ("prefix caching hit rate", "kv-cache-prefix-caching"),
        ("time to first token definition", "metrics"),
        ("KV cache bytes per token formula", "memory-fundamentals"),
        ("FP8 quantization quality impact", "quantization"),
        ("speculative decoding acceptance rate", "speculative-decoding"),
        ("EAGLE draft model", "speculative-decoding"),
        ("continuous batching vs static batching", "batching-and-scheduling"),
        ("chunked prefill token budget", "batching-and-scheduling"),
        ("tensor parallel communication NVLink", "parallelism"),
        ("prefill decode disaggregation KV transfer", "pd-disaggregation"),
        ("session sticky routing consistent hashing", "inference-routing"),
        ("LMCache offload CPU memory", "kv-cache-offload"),
        ("CUDA graphs enforce eager", "kernels-and-runtime"),
        ("which inference engine should I choose", "engine-selection"),
        ("compare vllm sglang tensorrt-llm", "engine-selection"),
        ("llama.cpp GGUF", "engine-selection"),
        ("autoscaling cold start model load time", "capacity-and-autoscaling"),
        ("bounded queue 429 overload", "queues-overload-admission"),
        ("canary rollback pinned image", "deployment-and-rollback"),
        ("nsight systems trace", "profiling"),
        ("warm-up sample size load generator", "benchmarking-method"),
        ("data residency tenant isolation", "security-and-compliance"),
        ("cost per successful request", "cost"),
        ("whisper ASR real-time factor", "serving-audio"),
        ("image tokens vision encoder", "serving-vision-language"),
        ("embedding model recall", "serving-embeddings"),
        ("diffusion denoising steps", "serving-image-video"),
        ("high TTFT normal ITL likely cause", "symptom-cause-table"),
        ("arithmetic intensity roofline decode bandwidth", "prefill-decode-roofline"),
        ("agent task latency many LLM calls", "agentic-workloads"),
        ("schedule policy longest prefix match", "batching-and-scheduling"),
        ("priority classes shed batch traffic", "queues-overload-admission"),
    ],
)
def test_realistic_questions_find_the_right_document_first(query: str, expected: str):
    assert _top(query) == [expected]


@pytest.mark.parametrize(
    "query",
    [
        'TTFT "high"',
        "kv-cache",
        "C++",
        "NEAR(ttft itl)",
        "ttft AND OR NOT",
        "*",
        '"',
        "col:title",
        "^prefix",
        "ü€🙂",
    ],
)
def test_fts_syntax_in_queries_never_crashes(query: str):
    result = kb.search(kb.SearchRequest(query=query))
    assert result.total_documents == len(kb.list_documents())
    for hit in result.hits:
        assert hit.score > 0 and hit.snippet


def test_hyphenated_terms_match_their_words():
    assert "kv-cache-prefix-caching" in _top("kv-cache prefix", 3)


def test_tags_filter_restricts_hits_and_unknown_tag_is_input_error():
    hits = kb.search(kb.SearchRequest(query="latency", tags=["production"], limit=10)).hits
    assert hits and all("production" in h.tags for h in hits)
    with pytest.raises(InputError) as info:
        kb.search(kb.SearchRequest(query="latency", tags=["no-such-tag"]))
    assert info.value.field == "tags" and "production" in (info.value.accepted or "")


def test_limit_is_bounded_and_respected():
    assert len(kb.search(kb.SearchRequest(query="latency", limit=2)).hits) == 2
    with pytest.raises(ValidationError):
        kb.SearchRequest(query="x", limit=0)
    with pytest.raises(ValidationError):
        kb.SearchRequest(query="x", limit=51)
    with pytest.raises(ValidationError):
        kb.SearchRequest(query="x", unknown=1)


def test_scores_descend_and_snippets_highlight_matches():
    hits = kb.search(kb.SearchRequest(query="preemption kv cache usage", limit=5)).hits
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert any("**" in h.snippet for h in hits)
    assert all("`" not in h.snippet for h in hits), "snippets are plain text plus highlighting"


def test_show_and_unknown_id_suggests_closest():
    doc = kb.show(kb.ShowRequest(id="metrics"))
    assert "TTFT" in doc.body_markdown and doc.sources
    with pytest.raises(InputError) as info:
        kb.show(kb.ShowRequest(id="metric"))
    assert info.value.field == "id"
    assert "closest: metrics" in info.value.message
    assert "quantization" in (info.value.accepted or "")


def test_documents_for_hypothesis():
    ids = [d.id for d in kb.documents_for("prefix_cache_miss")]
    assert "kv-cache-prefix-caching" in ids


def test_index_is_fast_and_thread_safe():
    kb._index.cache_clear()
    start = time.perf_counter()
    kb.search(kb.SearchRequest(query="prefix caching"))
    first = time.perf_counter() - start
    assert first < 1.0, f"building the index took {first:.2f} s"
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for q in ("ttft", "kv cache", "routing", "fp8"):
                assert kb.search(kb.SearchRequest(query=q)).hits
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# --- the CLI contract -------------------------------------------------------


def test_cli_search_markdown(capsys):
    assert main(["kb", "search", "prefix caching hit rate", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "`kv-cache-prefix-caching`" in out and "inferwise kb show" in out


def test_cli_search_json(capsys):
    assert main(["kb", "search", "speculative decoding", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hits"][0]["id"] == "speculative-decoding"
    assert set(data["hits"][0]) == {"id", "title", "score", "snippet", "tags"}


def test_cli_search_without_hits_says_so(capsys):
    assert main(["kb", "search", "zzzzqqqq"]) == 0
    assert "No document matches" in capsys.readouterr().out


def test_cli_show_renders_document_sources_and_playbooks(capsys):
    assert main(["kb", "show", "kv-cache-prefix-caching"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# KV cache paging")
    assert "https://docs.vllm.ai/en/latest/features/automatic_prefix_caching/" in out
    assert "`prefix_caching`" in out and "`prompt_restructuring`" in out


def test_cli_unknown_id_exits_2_with_one_line(capsys):
    assert main(["kb", "show", "quantisation"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "id" in err and "quantization" in err


def test_cli_subprocess_end_to_end():
    exe = Path(sys.executable).with_name("inferwise")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "inferwise.server"]
    ok = subprocess.run([*cmd, "kb", "show", "metrics"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "Time to first token" not in ok.stderr and "TTFT" in ok.stdout
    bad = subprocess.run(
        [*cmd, "kb", "show", "no-such-doc"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
