"""The knowledge base: Markdown documents with TOML front matter, and their search.

Documents live in ``docs/<id>.md``. Each starts with TOML front matter between
``+++`` lines (id, title, summary, tags, hypotheses, sources; optional
symptoms and related) followed by the Markdown body. The front matter ties a
document to the shared vocabulary, so diagnosis can point from a hypothesis id
to the document that explains it and the tests can prove every hypothesis is
covered.

Search is an SQLite FTS5 index over id, title, tags, summary and body, ranked
by BM25F (see the search section below).
The whole corpus is a few hundred kilobytes, so the index is built in memory
on first use (tens of milliseconds) rather than cached on disk: nothing can go
stale and nothing is written to the user's machine.

Only the stdlib and pydantic are imported at module level, so the MCP server
starts fast; the index is built on the first search.
"""

from __future__ import annotations

import difflib
import math
import re
import sqlite3
import threading
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from inferwise.calculators.errors import InputError, OperationalError
from inferwise.knowledge.vocabulary import HYPOTHESES, SYMPTOMS

# ---------------------------------------------------------------------------
# models (the CLI / MCP contract)


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        min_length=1,
        max_length=500,
        description=(
            "What to look up, in plain words (e.g. 'prefix caching hit rate', 'time to first token "
            "definition', 'fp8 kv cache quality'). Punctuation and search operators are ignored."
        ),
        json_schema_extra={"cli_positional": True},
    )
    limit: int = Field(5, ge=1, le=50, description="Maximum number of documents to return (1-50).")
    tags: list[str] | None = Field(
        None,
        description=(
            "Only return documents carrying all of these tags (e.g. 'playbook', 'metrics', "
            "'production', 'modality'). Omit to search everything."
        ),
    )


class Hit(BaseModel):
    id: str = Field(description="Document id; pass it to `kb show` / read it as a resource.")
    title: str
    score: float = Field(
        description="Relevance (bm25, higher is better; only comparable within one search)."
    )
    snippet: str = Field(description="Matching passage with the matched words in **bold**.")
    tags: list[str]


class SearchResult(BaseModel):
    query: str
    hits: list[Hit]
    total_documents: int = Field(description="Number of documents in the knowledge base.")


class ShowRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(
        min_length=1,
        max_length=200,
        description="Document id as returned by search (e.g. 'metrics', 'kv-cache-prefix-caching').",
        json_schema_extra={"cli_positional": True},
    )


class Document(BaseModel):
    id: str
    title: str
    summary: str = Field(description="One or two sentences: what the document answers.")
    tags: list[str]
    hypotheses: list[str] = Field(
        description="Bottleneck hypothesis ids this document helps to prove or fix."
    )
    symptoms: list[str] = Field(
        default_factory=list, description="Symptom ids this document explains."
    )
    sources: list[str] = Field(
        description="Official documentation URLs to verify the facts against."
    )
    related: list[str] = Field(default_factory=list, description="Ids of related documents.")
    playbooks: list[str] = Field(
        default_factory=list, description="Ids of structured playbooks based on it."
    )
    body_markdown: str


class DocumentInfo(BaseModel):
    """A document without its body: what a listing (MCP resources) needs."""

    id: str
    title: str
    summary: str
    tags: list[str]


# ---------------------------------------------------------------------------
# loading


class DocumentError(OperationalError, ValueError):
    """A knowledge document is malformed (a packaging bug): names the file and field.

    An OperationalError so the front doors report it in one line (exit 1)
    instead of a traceback."""


_REQUIRED = {"id", "title", "summary", "tags", "hypotheses", "sources"}
_OPTIONAL = {"symptoms", "related"}
_ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


def parse_document(text: str, source: str = "<string>") -> Document:
    """Split front matter from body and validate the front matter against the vocabulary."""
    if not text.startswith("+++\n"):
        raise DocumentError(f"{source}: must start with a '+++' front-matter line")
    end = text.find("\n+++\n", 4)
    if end < 0:
        raise DocumentError(f"{source}: front matter is not closed by a '+++' line")
    try:
        meta: dict[str, Any] = tomllib.loads(text[4:end])
    except tomllib.TOMLDecodeError as exc:
        raise DocumentError(f"{source}: front matter is not valid TOML: {exc}") from exc
    body = text[end + 5 :].strip() + "\n"

    missing = _REQUIRED - set(meta)
    if missing:
        raise DocumentError(f"{source}: front matter lacks {sorted(missing)}")
    unknown = set(meta) - _REQUIRED - _OPTIONAL
    if unknown:
        raise DocumentError(f"{source}: unknown front-matter key(s) {sorted(unknown)}")
    if not isinstance(meta["id"], str) or not _ID_RE.match(meta["id"]):
        raise DocumentError(f"{source}: id must be lower-case words joined by '-'")
    for key in ("title", "summary"):
        if not isinstance(meta[key], str) or not meta[key].strip():
            raise DocumentError(f"{source}: {key} must be a non-empty string")
    for key in ("tags", "hypotheses", "sources", "symptoms", "related"):
        value = meta.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise DocumentError(f"{source}: {key} must be a list of strings")
    if not meta["tags"] or not meta["sources"]:
        raise DocumentError(f"{source}: tags and sources must not be empty")
    bad = [h for h in meta["hypotheses"] if h not in HYPOTHESES]
    if bad:
        raise DocumentError(f"{source}: unknown hypothesis id(s) {bad}")
    bad = [s for s in meta.get("symptoms", []) if s not in SYMPTOMS]
    if bad:
        raise DocumentError(f"{source}: unknown symptom id(s) {bad}")
    bad = [u for u in meta["sources"] if not u.startswith("https://")]
    if bad:
        raise DocumentError(f"{source}: sources must be https:// URLs, got {bad}")
    return Document(
        id=meta["id"],
        title=meta["title"].strip(),
        summary=" ".join(meta["summary"].split()),
        tags=list(meta["tags"]),
        hypotheses=list(meta["hypotheses"]),
        symptoms=list(meta.get("symptoms", [])),
        sources=list(meta["sources"]),
        related=list(meta.get("related", [])),
        body_markdown=body,
    )


@lru_cache(maxsize=1)
def _corpus() -> dict[str, Document]:
    """Every document by id, validated once per process (ids unique, cross-references resolvable)."""
    from inferwise.knowledge.playbooks import load_playbooks

    folder = resources.files("inferwise.knowledge") / "docs"
    docs: dict[str, Document] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".md"):
            continue
        source = f"docs/{entry.name}"
        doc = parse_document(entry.read_text(encoding="utf-8"), source)
        if entry.name != f"{doc.id}.md":
            raise DocumentError(f"{source}: id {doc.id!r} must match the file name")
        docs[doc.id] = doc
    for doc in docs.values():
        dangling = [r for r in doc.related if r not in docs]
        if dangling:
            raise DocumentError(f"docs/{doc.id}.md: related id(s) {dangling} do not exist")
    by_doc: dict[str, list[str]] = {}
    for pb in load_playbooks():
        by_doc.setdefault(pb.doc, []).append(pb.id)
    return {i: d.model_copy(update={"playbooks": by_doc.get(i, [])}) for i, d in docs.items()}


def list_documents() -> list[DocumentInfo]:
    """All documents without bodies, ordered by id (for listings and MCP resources)."""
    return [
        DocumentInfo(id=d.id, title=d.title, summary=d.summary, tags=d.tags)
        for d in _corpus().values()
    ]


def documents_for(hypothesis_id: str) -> list[DocumentInfo]:
    """Documents that explain `hypothesis_id` (diagnosis and planning cite them)."""
    return [
        DocumentInfo(id=d.id, title=d.title, summary=d.summary, tags=d.tags)
        for d in _corpus().values()
        if hypothesis_id in d.hypotheses
    ]


def get_document(doc_id: str) -> Document:
    """One document by id; an unknown id is an InputError that suggests the closest ids."""
    docs = _corpus()
    key = doc_id.strip().lower()
    if key in docs:
        return docs[key]
    holders = [d.id for d in docs.values() if key in d.playbooks]
    if holders:  # plans name playbooks; point at the document that describes them
        raise InputError(
            "id",
            f"{doc_id!r} is a playbook, described in document {holders[0]!r}: "
            f"`inferwise kb show {holders[0]}`",
            ", ".join(docs),
        )
    closest = difflib.get_close_matches(key, list(docs), n=3, cutoff=0.6)
    if not closest:
        words = _query_words(key.replace("-", " ").replace("_", " "))
        closest = [h["id"] for h in _ranked(words, 3)] if words else []
    hint = ", ".join(closest) if closest else "none; try `kb search`"
    raise InputError("id", f"unknown document {doc_id!r}; closest: {hint}", ", ".join(docs))


def show(req: ShowRequest) -> Document:
    return get_document(req.id)


# ---------------------------------------------------------------------------
# search
#
# FTS5 holds the index (tokenizing, porter stemming, the term vocabulary and
# snippets). Ranking is BM25F computed from FTS5's own vocabulary table rather
# than FTS5's built-in bm25(): with a corpus of a few dozen documents, FTS5
# clamps the IDF of any word found in more than half the documents to ~0, so a
# query like "which engine should I use" would rank by noise. The Lucene IDF
# used here, ln(1 + (N - n + 0.5) / (n + 0.5)), stays positive.

_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "do",
        "does",
        "for",
        "from",
        "how",
        "i",
        "in",
        "is",
        "it",
        "of",
        "on",
        "or",
        "the",
        "to",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "with",
        "my",
        "our",
        "we",
        "you",
        "your",
        "this",
        "that",
        "these",
        "those",
        "can",
        "should",
        "would",
        "could",
        "will",
        "use",
        "using",
        "used",
        "need",
        "want",
        "get",
        "make",
        "there",
        "if",
        "about",
        "into",
        "than",
        "then",
        "so",
        "very",
        "also",
        "just",
    ]
)
_WORD_RE = re.compile(r"\w+", re.UNICODE)
_COLUMNS = ("id_words", "title", "tags", "summary", "body")
_WEIGHTS = (8.0, 6.0, 3.0, 3.0, 1.0)
"""Field weights in the order of _COLUMNS: a word in the title counts six body occurrences."""
_K1, _B = 1.2, 0.75
_TOKENIZE = "\"porter unicode61 tokenchars '_'\""
"""Porter stemming; `_` joins words so identifiers (max_num_seqs, vllm:kv_cache_usage_perc,
hypothesis ids) are one token: they match exactly and snippets do not split them."""
_IDF_FLOOR = 0.2
"""Words found in nearly every document (\"engine\", \"latency\") still count a little, so a
title match on them can decide between otherwise equal documents."""


def _query_words(text: str) -> list[str]:
    """Word characters only, lower-cased, stopwords dropped (unless nothing else is left).

    Users type things like `TTFT "high"`, `kv-cache`, `C++` or `NEAR(`; FTS5 would
    read quotes, hyphens and keywords as syntax, so only words survive."""
    words = [w.lower() for w in _WORD_RE.findall(text)]
    kept = [w for w in words if w not in _STOPWORDS] or words
    return list(dict.fromkeys(kept))[:32]


def _fts_query(text: str) -> str:
    """A safe FTS5 MATCH expression: every word quoted as a literal, OR-ed."""
    return " OR ".join(f'"{w}"' for w in _query_words(text))


def _plain(markdown: str) -> str:
    """Markdown to indexable text, so snippets carry only the match highlighting."""
    text = re.sub(r"[`*|>#]+", " ", markdown)
    return re.sub(r"[ \t]+", " ", text)


@dataclass
class _Index:
    conn: sqlite3.Connection
    lock: threading.Lock
    ids: dict[int, str]
    """rowid -> document id"""
    postings: dict[str, dict[int, float]]
    """stemmed term -> rowid -> field-weighted term frequency"""
    doc_freq: dict[str, int]
    lengths: dict[int, float]
    """rowid -> field-weighted document length"""
    avg_length: float


@lru_cache(maxsize=1)
def _index() -> _Index:
    """Build the in-memory FTS5 index and the BM25F statistics (about 50 ms for the corpus).

    Plain sqlite3 rather than sqlite-utils: the index needs two statements, and
    importing sqlite-utils costs ~250 ms, which a stdio MCP server would pay on
    its first search."""
    # The MCP server may call from worker threads: one connection, guarded by a lock.
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    columns = ", ".join(_COLUMNS)
    conn.execute(
        f"create virtual table docs_fts using fts5(doc_id unindexed, {columns}, tokenize={_TOKENIZE})"
    )
    conn.executemany(
        f"insert into docs_fts(doc_id, {columns}) values (?, ?, ?, ?, ?, ?)",
        [
            (
                d.id,
                d.id.replace("-", " "),
                d.title,
                " ".join(d.tags),
                d.summary,
                _plain(d.body_markdown),
            )
            for d in _corpus().values()
        ],
    )
    conn.execute("create virtual table docs_terms using fts5vocab(docs_fts, 'instance')")
    # the query side goes through the same tokenizer, so query words are stemmed identically
    conn.execute(f"create virtual table query_fts using fts5(q, tokenize={_TOKENIZE})")
    conn.execute("create virtual table query_terms using fts5vocab(query_fts, 'row')")

    ids = {rowid: doc_id for rowid, doc_id in conn.execute("select rowid, doc_id from docs_fts")}
    postings: dict[str, dict[int, float]] = {}
    lengths: dict[int, float] = dict.fromkeys(ids, 0.0)
    for term, rowid, col, count in conn.execute(
        "select term, doc, col, count(*) from docs_terms group by term, doc, col"
    ):
        weight = _WEIGHTS[_COLUMNS.index(col)] * count
        per_doc = postings.setdefault(term, {})
        per_doc[rowid] = per_doc.get(rowid, 0.0) + weight
        lengths[rowid] += weight
    doc_freq = {term: len(per_doc) for term, per_doc in postings.items()}
    avg = sum(lengths.values()) / max(len(lengths), 1)
    return _Index(conn, threading.Lock(), ids, postings, doc_freq, lengths, avg)


def _stemmed(index: _Index, words: list[str]) -> list[str]:
    with index.lock:
        index.conn.execute("delete from query_fts")
        index.conn.execute("insert into query_fts(q) values (?)", [" ".join(words)])
        return [t for (t,) in index.conn.execute("select term from query_terms")]


def _ranked(words: list[str], limit: int) -> list[dict[str, Any]]:
    """Top documents for `words` by BM25F, each with an FTS5 snippet."""
    index = _index()
    n_docs = len(index.ids)
    scores: dict[int, float] = {}
    for term in _stemmed(index, words):
        per_doc = index.postings.get(term)
        if not per_doc:
            continue
        n = index.doc_freq[term]
        idf = max(math.log(1.0 + (n_docs - n + 0.5) / (n + 0.5)), _IDF_FLOOR)
        for rowid, tf in per_doc.items():
            norm = _K1 * (1.0 - _B + _B * index.lengths[rowid] / index.avg_length)
            scores[rowid] = scores.get(rowid, 0.0) + idf * tf * (_K1 + 1.0) / (tf + norm)
    top = sorted(scores, key=lambda r: (-scores[r], index.ids[r]))[:limit]
    if not top:
        return []
    marks = ",".join("?" * len(top))
    sql = (
        "select rowid, snippet(docs_fts, 5, '**', '**', ' … ', 24) from docs_fts "
        f"where docs_fts match ? and rowid in ({marks})"
    )
    with index.lock:
        snippets = dict(index.conn.execute(sql, [_fts_query(" ".join(words)), *top]).fetchall())
    return [{"id": index.ids[r], "score": scores[r], "snippet": snippets.get(r, "")} for r in top]


def _clean_snippet(text: str) -> str:
    return " ".join(text.split())


def search(req: SearchRequest) -> SearchResult:
    """Best-matching documents for a free-text query, optionally restricted to tags."""
    docs = _corpus()
    wanted: set[str] = set()
    if req.tags:
        wanted = {t.strip().lower() for t in req.tags if t.strip()}
        known = sorted({t for d in docs.values() for t in d.tags})
        unknown = sorted(wanted - set(known))
        if unknown:
            raise InputError("tags", f"unknown tag(s) {unknown}", ", ".join(known))
    words = _query_words(req.query)
    hits: list[Hit] = []
    # rank everything when filtering by tag, so the filter can still fill `limit`
    for row in _ranked(words, len(docs) if wanted else req.limit) if words else []:
        doc = docs[row["id"]]
        if wanted and not wanted <= set(doc.tags):
            continue
        snippet = _clean_snippet(row["snippet"]) or doc.summary
        hits.append(
            Hit(
                id=doc.id,
                title=doc.title,
                score=round(row["score"], 3),
                snippet=snippet,
                tags=doc.tags,
            )
        )
        if len(hits) >= req.limit:
            break
    return SearchResult(query=req.query, hits=hits, total_documents=len(docs))
