"""The knowledge documents: front matter, links, and coverage of the shared vocabulary.

Diagnosis and planning cite documents by hypothesis id, and the symptom table
is what `diagnose` explains itself with, so coverage gaps are real defects."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferwise.knowledge import kb
from inferwise.knowledge.vocabulary import HYPOTHESES, SYMPTOMS

DOCS = Path(kb.__file__).parent / "docs"
DESIGN = Path(__file__).resolve().parents[2] / "shared" / "DESIGN.md"
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)]+)\)")
URL_RE = re.compile(r"https?://[^\s)>`|,]+")


def _doc_files() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_corpus_size_and_ids_match_files():
    files = _doc_files()
    assert 25 <= len(files) <= 60
    docs = kb.list_documents()
    assert [d.id for d in docs] == sorted(f.stem for f in files)


@pytest.mark.parametrize("path", _doc_files(), ids=lambda p: p.stem)
def test_document_front_matter_and_links(path: Path):
    doc = kb.parse_document(path.read_text(encoding="utf-8"), path.name)
    assert doc.id == path.stem
    assert doc.title and doc.summary and doc.tags and doc.sources
    assert len(doc.body_markdown.split()) >= 150, "a document should say something"
    assert "+++" not in doc.body_markdown, "front matter must be closed exactly once"
    known = {d.id for d in kb.list_documents()}
    assert set(doc.related) <= known
    for url in doc.sources:
        assert url.startswith("https://") and " " not in url
    # inline links must be absolute https URLs (documents are rendered outside the repo)
    for target in LINK_RE.findall(doc.body_markdown):
        assert target.startswith("https://"), f"{path.name}: link {target!r}"
    for url in URL_RE.findall(doc.body_markdown):
        assert url.startswith("https://"), f"{path.name}: insecure URL {url}"


def test_every_hypothesis_is_covered_by_a_document():
    covered = {h for d in kb.list_documents() for h in kb.get_document(d.id).hypotheses}
    assert set(HYPOTHESES) - covered == set()


def test_symptom_table_holds_every_symptom_and_hypothesis():
    table = kb.get_document("symptom-cause-table")
    for sid in SYMPTOMS:
        assert f"`{sid}`" in table.body_markdown, sid
    for hid in HYPOTHESES:
        assert f"`{hid}`" in table.body_markdown, hid
    assert set(table.symptoms) == set(SYMPTOMS)


def test_seed_table_rows_are_mapped_as_the_seeds_say():
    """The five rows of the source symptom table, with their cause lists, verbatim in ids."""
    body = kb.get_document("symptom-cause-table").body_markdown
    rows = {
        "`ttft_high` + `itl_normal`": [
            "queueing",
            "long_prompts",
            "prefill_compute",
            "cold_start",
            "preprocessing",
        ],
        "`ttft_normal` + `itl_high`": [
            "decode_bandwidth",
            "batch_contention",
            "kv_cache_pressure",
            "kernel_efficiency",
        ],
        "`both_degrade_with_concurrency`": [
            "queueing",
            "memory_capacity",
            "batch_policy",
            "admission_control",
            "saturation",
        ],
        "`gpu_util_low` + `latency_high`": [
            "cpu_tokenization",
            "data_transfer",
            "synchronization",
            "network",
            "scheduling",
        ],
        "`throughput_up_tail_violates`": ["batch_policy", "admission_control", "workload_mixing"],
    }
    lines = {
        line.split("|")[1].strip(): line for line in body.splitlines() if line.startswith("| `")
    }
    for key, causes in rows.items():
        assert key in lines, key
        for cause in causes:
            assert f"`{cause}`" in lines[key].split("|")[2], (key, cause)


@pytest.mark.skipif(not DESIGN.exists(), reason="shared DESIGN.md not next to the checkout")
def test_vocabulary_matches_design():
    text = DESIGN.read_text(encoding="utf-8")
    sym = text.split("- symptoms:", 1)[1].split("- bottleneck hypotheses:", 1)
    hyp = sym[1].split("\n\n", 1)[0]
    assert re.findall(r"`([a-z_]+)`", sym[0]) == list(SYMPTOMS)
    assert re.findall(r"`([a-z_]+)`", hyp) == list(HYPOTHESES)


def test_topics_the_issue_lists_have_a_document():
    ids = {d.id for d in kb.list_documents()}
    for required in [
        "workload-characterisation",
        "metrics",
        "symptom-cause-table",
        "memory-fundamentals",
        "prefill-decode-roofline",
        "engine-selection",
        "batching-and-scheduling",
        "quantization",
        "speculative-decoding",
        "kv-cache-prefix-caching",
        "kv-cache-offload",
        "parallelism",
        "pd-disaggregation",
        "inference-routing",
        "kernels-and-runtime",
        "offline-batch-inference",
        "benchmarking-method",
        "profiling",
        "capacity-and-autoscaling",
        "queues-overload-admission",
        "reliability",
        "deployment-and-rollback",
        "observability",
        "cost",
        "security-and-compliance",
        "serving-embeddings",
        "serving-vision-language",
        "serving-audio",
        "serving-image-video",
    ]:
        assert required in ids, required


def test_engine_profiles_link_official_docs_and_say_verify():
    doc = kb.get_document("engine-selection")
    for name, url in [
        ("vLLM", "https://docs.vllm.ai/"),
        ("SGLang", "https://docs.sglang.io/"),
        ("TensorRT-LLM", "https://nvidia.github.io/TensorRT-LLM/"),
        ("llama.cpp", "https://github.com/ggml-org/llama.cpp"),
        ("LMDeploy", "https://lmdeploy.readthedocs.io/"),
        ("Dynamo", "https://docs.nvidia.com/dynamo/"),
        ("llm-d", "https://llm-d.ai/docs"),
        ("Ollama", "https://docs.ollama.com/"),
        ("Text Generation Inference", "https://huggingface.co/docs/text-generation-inference/"),
    ]:
        assert name in doc.body_markdown and url in doc.body_markdown, name
    assert "verify" in doc.body_markdown.lower()


@pytest.mark.parametrize(
    "text, problem",
    [
        ("no front matter\n", "must start"),
        ("+++\nid = 'x'\n", "not closed"),
        ("+++\nid = 'x'\ntitle = 't'\n+++\nbody\n", "lacks"),
        (
            "+++\nid='x'\ntitle='t'\nsummary='s'\ntags=['a']\nhypotheses=['nope']\nsources=['https://a']\n+++\nb\n",
            "unknown hypothesis",
        ),
        (
            "+++\nid='x'\ntitle='t'\nsummary='s'\ntags=['a']\nhypotheses=[]\nsources=['http://a']\n+++\nb\n",
            "https",
        ),
        (
            "+++\nid='x'\ntitle='t'\nsummary='s'\ntags=['a']\nhypotheses=[]\nsources=['https://a']\ntypo=1\n+++\nb\n",
            "unknown front-matter",
        ),
    ],
)
def test_malformed_documents_fail_with_the_file_name(text: str, problem: str):
    with pytest.raises(kb.DocumentError, match=problem) as info:
        kb.parse_document(text, "docs/bad.md")
    assert "docs/bad.md" in str(info.value)
