"""The knowledge base: Markdown documents with TOML front matter, and their search.

Documents live in ``docs/<id>.md``. Each starts with TOML front matter between
``+++`` lines (id, title, summary, tags, hypotheses, sources; optional
symptoms and related) followed by the Markdown body. The front matter ties a
document to the shared vocabulary, so diagnosis can point from a hypothesis id
to the document that explains it and the tests can prove every hypothesis is
covered.

Search is SQLite FTS5 with bm25 ranking over id, title, tags, summary and body.
The whole corpus is a few hundred kilobytes, so the index is built in memory
on first use (tens of milliseconds) rather than cached on disk: nothing can go
stale and nothing is written to the user's machine.

Only the stdlib and pydantic are imported at module level; sqlite-utils is
imported when the index is first built, so the MCP server starts fast.
"""

from __future__ import annotations

import difflib
import re
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
    closest = difflib.get_close_matches(key, list(docs), n=3, cutoff=0.5)
    if not closest:
        words = _fts_query(key.replace("-", " ").replace("_", " "))
        closest = [h["id"] for h in _ranked(words, 3)] if words else []
    hint = ", ".join(closest) if closest else "none; try `kb search`"
    raise InputError("id", f"unknown document {doc_id!r}; closest: {hint}", ", ".join(docs))


def show(req: ShowRequest) -> Document:
    return get_document(req.id)


# ---------------------------------------------------------------------------
# search

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
    ]
)
_WORD_RE = re.compile(r"\w+", re.UNICODE)


def _fts_query(text: str) -> str:
    """Turn free text into a safe FTS5 expression.

    Users type things like `TTFT "high"`, `kv-cache`, `C++` or `NEAR(`; FTS5 would
    read quotes, hyphens and keywords as syntax. Only word characters survive,
    each word is quoted as a literal, and the words are OR-ed so bm25 ranks
    documents by how many and how rare the matched words are."""
    words = [w.lower() for w in _WORD_RE.findall(text)]
    kept = [w for w in words if w not in _STOPWORDS] or words
    unique = list(dict.fromkeys(kept))[:32]
    return " OR ".join(f'"{w}"' for w in unique)


@dataclass
class _Index:
    db: Any
    """A sqlite_utils.Database holding table ``docs`` and its FTS5 table ``docs_fts``."""


@lru_cache(maxsize=1)
def _index() -> _Index:
    import sqlite_utils

    db = sqlite_utils.Database(memory=True)
    rows = [
        {
            "id": d.id,
            "id_words": d.id.replace("-", " "),
            "title": d.title,
            "tags": " ".join(d.tags),
            "summary": d.summary,
            "body": d.body_markdown,
        }
        for d in _corpus().values()
    ]
    db["docs"].insert_all(rows, pk="id")
    db["docs"].enable_fts(
        ["id_words", "title", "tags", "summary", "body"], tokenize="porter unicode61"
    )
    return _Index(db)


# column weights for bm25, in the order given to enable_fts: id, title, tags, summary, body
_WEIGHTS = "8.0, 6.0, 3.0, 3.0, 1.0"


def _ranked(fts_query: str, limit: int) -> list[dict[str, Any]]:
    sql = f"""
        select docs.id as id, -bm25(docs_fts, {_WEIGHTS}) as score,
               snippet(docs_fts, 4, '**', '**', ' … ', 24) as snippet
        from docs_fts join docs on docs.rowid = docs_fts.rowid
        where docs_fts match ?
        order by bm25(docs_fts, {_WEIGHTS})
        limit ?
    """
    cursor = _index().db.execute(sql, [fts_query, limit])
    cols = [c[0] for c in cursor.description]
    return [dict(zip(cols, row, strict=True)) for row in cursor.fetchall()]


def _clean_snippet(text: str) -> str:
    """Snippets cut Markdown mid-structure; flatten it to one readable line."""
    text = re.sub(r"^\s*[#>|-]+\s*", "", text, flags=re.MULTILINE)
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
    fts = _fts_query(req.query)
    hits: list[Hit] = []
    if fts:
        # fetch extra rows so the tag filter can still fill `limit`
        for row in _ranked(fts, len(docs) if wanted else req.limit):
            doc = docs[row["id"]]
            if wanted and not wanted <= set(doc.tags):
                continue
            hits.append(
                Hit(
                    id=doc.id,
                    title=doc.title,
                    score=round(float(row["score"]), 3),
                    snippet=_clean_snippet(row["snippet"] or doc.summary),
                    tags=doc.tags,
                )
            )
            if len(hits) >= req.limit:
                break
    return SearchResult(query=req.query, hits=hits, total_documents=len(docs))
