"""Quality graders: does one output pass the row's check, and which rows carry one.

A dataset row may carry ``expected`` and ``grader`` (``exact``, ``contains``,
``regex``, ``numeric``, ``json_schema``, ``choice``); two public eval shapes
imply their grader: GSM8K-style ``question``/``answer`` (``numeric``, the
answer after ``####``) and multiple-choice ``question``/``choices``/``answer``
(``choice``; the choices are rendered into the prompt as ``A. ...`` lines).
Every grader is compiled when the file is read, so a bad regex, schema or
expected value stops the probe before anything is sent, naming the line and
the field.

What each grader accepts (documented because a user's eval depends on it):

* ``exact``: the output equals ``expected`` after stripping surrounding whitespace.
* ``contains``: ``expected`` occurs in the output, ignoring case.
* ``regex``: ``re.search(expected, output)`` finds a match (write ``(?i)`` for case).
* ``numeric``: the last number in the output (commas and a leading ``$`` allowed,
  as in GSM8K) is within ``tolerance`` (absolute, default 1e-6) of ``expected``.
* ``json_schema``: the output (or its first fenced ```json block) parses as JSON
  and validates against ``schema`` (or an object ``expected``), JSON Schema 2020-12.
* ``choice``: the letter the output names (``Answer: B``, ``(B)``, a leading
  ``B.``, else the first standalone letter) equals ``expected`` (a letter, or a
  0-based index, or the text of one of ``choices``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from inferwise.calculators.errors import InputError

GRADERS = ("exact", "contains", "regex", "numeric", "json_schema", "choice")
LETTERS = "ABCDEFGHIJ"
"""Choice letters: four for MMLU/ARC, up to ten for MMLU-Pro."""

_NUMBER_RE = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\$?\.\d+")
_ANSWER_LETTER_RE = re.compile(r"answer\s*(?:is|:)?\s*[:\s]*\(?\s*([A-J])\b(?![A-Za-z])", re.I)
_LEADING_LETTER_RE = re.compile(r"^\s*\(?([A-J])(?:[).:\]]|\s|$)")
_LONE_LETTER_RE = re.compile(r"(?<![A-Za-z])\(?([A-J])\)?(?![A-Za-z])")
_FENCED_JSON_RE = re.compile(r"```(?:json)?\s*(.*?)```", re.S)


@dataclass(frozen=True)
class Grader:
    """One row's check, compiled. `expected` is what the check compares with: text,
    a number (numeric), a letter (choice) or a JSON Schema (json_schema)."""

    name: str
    expected: Any
    tolerance: float = 1e-6
    letters: str = LETTERS[:4]

    def grade(self, output: str) -> bool:
        """Whether `output` passes; never raises (a model's text is arbitrary)."""
        try:
            return bool(_GRADE[self.name](self, output))
        except Exception:  # a validator bug must not kill the run: the output fails
            return False


@dataclass(frozen=True)
class GradedPrompt:
    """What a dataset row adds for grading: the prompt to send (choices rendered in), its
    stable id (row `id`, else a hash of the prompt) and the compiled grader, if any."""

    prompt: str | None
    prompt_id: str
    grader: Grader | None


def _exact(g: Grader, out: str) -> bool:
    return out.strip() == g.expected


def _contains(g: Grader, out: str) -> bool:
    return g.expected.casefold() in out.casefold()


def _regex(g: Grader, out: str) -> bool:
    return g.expected.search(out) is not None


def last_number(text: str) -> float | None:
    """The last number in `text` (GSM8K's convention for a free-form answer), or None."""
    found = _NUMBER_RE.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", "").replace("$", ""))
    except ValueError:
        return None


def _numeric(g: Grader, out: str) -> bool:
    got = last_number(out)
    return got is not None and abs(got - g.expected) <= g.tolerance


def _json_schema(g: Grader, out: str) -> bool:
    import jsonschema

    text = out.strip()
    fenced = _FENCED_JSON_RE.search(text)
    try:
        doc = json.loads(fenced.group(1) if fenced else text)
    except ValueError:
        return False
    return jsonschema.Draft202012Validator(g.expected).is_valid(doc)


def chosen_letter(text: str, letters: str = LETTERS[:4]) -> str | None:
    """The choice `text` names: 'answer is B' / 'Answer: (B)' first, then a leading
    'B.' or '(B)', then the first standalone letter among `letters`."""
    for m in reversed(_ANSWER_LETTER_RE.findall(text)):
        if m.upper() in letters:
            return m.upper()
    m = _LEADING_LETTER_RE.match(text)
    if m and m.group(1) in letters:
        return m.group(1)
    for m in _LONE_LETTER_RE.findall(text):
        if m in letters:
            return m
    return None


def _choice(g: Grader, out: str) -> bool:
    return chosen_letter(out, g.letters) == g.expected


_GRADE = {
    "exact": _exact,
    "contains": _contains,
    "regex": _regex,
    "numeric": _numeric,
    "json_schema": _json_schema,
    "choice": _choice,
}


# --------------------------------------------------------------------------- reading rows


def _bad(line: int, field: str, message: str, accepted: str | None = None) -> InputError:
    return InputError("dataset", f"line {line}, field `{field}`: {message}", accepted)


def _number(value: Any, line: int, field: str) -> float:
    """A number from a JSON number or a string (GSM8K: the text after '####')."""
    if isinstance(value, bool):
        raise _bad(line, field, "must be a number, not true/false")
    if isinstance(value, int | float):
        x = float(value)
    elif isinstance(value, str):
        text = value.rsplit("####", 1)[-1] if "####" in value else value
        got = last_number(text)
        if got is None:
            raise _bad(line, field, f"holds no number: {value[:80]!r}", "e.g. 42 or '... #### 42'")
        x = got
    else:
        raise _bad(line, field, "must be a number or a string holding one")
    if not math.isfinite(x):
        raise _bad(line, field, "must be finite")
    return x


def _schema(value: Any, line: int) -> dict[str, Any]:
    import jsonschema

    if not isinstance(value, dict):
        raise _bad(line, "schema", "must be a JSON object (a JSON Schema)")
    try:
        jsonschema.Draft202012Validator.check_schema(value)
    except jsonschema.SchemaError as exc:
        raise _bad(line, "schema", f"is not a valid JSON Schema: {exc.message}") from None
    return value


def _choices(obj: dict[str, Any], line: int) -> tuple[list[str], list[str]] | None:
    """(labels, texts) of a multiple-choice row: a list of strings (MMLU) or ARC's
    {"text": [...], "label": [...]}; None when the row has no choices."""
    raw = obj.get("choices")
    if raw is None:
        return None
    texts: Any = raw.get("text") if isinstance(raw, dict) else raw
    labels: Any = raw.get("label") if isinstance(raw, dict) else None
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise _bad(line, "choices", "must be a list of strings (or ARC's {text, label})")
    if not 2 <= len(texts) <= len(LETTERS):
        raise _bad(line, "choices", f"needs 2 to {len(LETTERS)} choices, got {len(texts)}")
    letters = list(LETTERS[: len(texts)])
    if labels is not None:
        if not isinstance(labels, list) or len(labels) != len(texts):
            raise _bad(line, "choices", "`label` must list one label per text")
        letters = [str(x).strip().upper() for x in labels]
        if any(x not in LETTERS for x in letters):  # ARC sometimes labels 1-4
            letters = list(LETTERS[: len(texts)])
    return letters, texts


def _choice_letter(value: Any, letters: list[str], texts: list[str] | None, line: int) -> str:
    field = "expected"
    if isinstance(value, bool):
        raise _bad(line, field, "must be a letter, an index or a choice's text")
    if isinstance(value, int):
        if 0 <= value < len(letters):
            return letters[value]
        raise _bad(line, field, f"index {value} is outside the {len(letters)} choices")
    if isinstance(value, str):
        v = value.strip()
        if v.upper() in letters:
            return v.upper()
        if texts and v in texts:
            return letters[texts.index(v)]
    raise _bad(line, field, f"{value!r} names no choice", ", ".join(letters))


def render_choices(question: str, letters: list[str], texts: list[str]) -> str:
    """The multiple-choice prompt: question, lettered choices, the answer format asked for."""
    lines = [question.rstrip(), ""]
    lines += [f"{a}. {t}" for a, t in zip(letters, texts, strict=True)]
    lines += ["", "Answer with the letter of the correct choice."]
    return "\n".join(lines)


def prompt_id(obj: dict[str, Any], prompt: str | None) -> str:
    """The row's `id` when it has one, else a hash of what is sent: the same prompt gets
    the same id in every run, which is what pairs graded prompts across runs."""
    rid = obj.get("id")
    if isinstance(rid, str | int) and not isinstance(rid, bool) and str(rid):
        return str(rid)[:200]
    basis = prompt if prompt is not None else json.dumps(obj.get("messages"), sort_keys=True)
    return hashlib.sha256(basis.encode("utf-8", "replace")).hexdigest()[:16]


def read_grading(obj: dict[str, Any], line: int) -> GradedPrompt:
    """The prompt, prompt id and grader of one dataset row (InputError naming line and
    field for anything wrong). `prompt` is None when the row gives no text of its own
    beyond what prompts.py reads (prompt/messages)."""
    grader = obj.get("grader")
    mc = _choices(obj, line)
    question = obj.get("question")
    prompt: str | None = None
    if question is not None:
        if not isinstance(question, str):
            raise _bad(line, "question", "must be a string")
        prompt = render_choices(question, *mc) if mc else question
        if grader is None and ("answer" in obj or "answerKey" in obj):
            grader = "choice" if mc else "numeric"
    if grader is None:
        if "expected" in obj:
            raise _bad(line, "grader", "`expected` is given without a grader", ", ".join(GRADERS))
        return GradedPrompt(prompt, prompt_id(obj, prompt or obj.get("prompt")), None)
    if grader not in GRADERS:
        raise _bad(line, "grader", f"unknown grader {grader!r}", ", ".join(GRADERS))
    if prompt is None and obj.get("prompt") is None and obj.get("messages") is None:
        raise _bad(line, "grader", "a graded row needs its own text", "prompt, messages, question")
    compiled = _compile(str(grader), obj, line, mc)
    return GradedPrompt(prompt, prompt_id(obj, prompt or obj.get("prompt")), compiled)


def _expected(obj: dict[str, Any], line: int, grader: str) -> Any:
    for key in ("expected", "answer", "answerKey"):
        if obj.get(key) is not None:
            return obj[key]
    if grader == "json_schema" and obj.get("schema") is not None:
        return None
    raise _bad(line, "expected", f"grader {grader!r} needs an expected answer")


def _compile(
    grader: str, obj: dict[str, Any], line: int, mc: tuple[list[str], list[str]] | None
) -> Grader:
    expected = _expected(obj, line, grader)
    if grader == "json_schema":
        source = obj.get("schema") if obj.get("schema") is not None else expected
        return Grader(grader, _schema(source, line))
    if grader == "numeric":
        tol = obj.get("tolerance", 1e-6)
        if isinstance(tol, bool) or not isinstance(tol, int | float) or not tol >= 0:
            raise _bad(line, "tolerance", "must be a number >= 0")
        return Grader(grader, _number(expected, line, "expected"), tolerance=float(tol))
    if grader == "choice":
        letters, texts = mc if mc else (list(LETTERS[:4]), None)
        letter = _choice_letter(expected, letters, texts, line)
        return Grader(grader, letter, letters="".join(letters))
    if not isinstance(expected, str):
        if grader == "regex" or isinstance(expected, bool | dict | list):
            raise _bad(line, "expected", f"grader {grader!r} needs a string")
        expected = json.dumps(expected)
    if grader == "regex":
        try:
            return Grader(grader, re.compile(expected))
        except re.error as exc:
            raise _bad(line, "expected", f"invalid regular expression: {exc}") from None
    return Grader(grader, expected.strip() if grader == "exact" else expected)


def output_hash(text: str) -> str:
    """What a run stores of every output even without --store-text: enough to tell two
    runs' greedy outputs apart (sha256 of the UTF-8 text, 32 hex digits)."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:32]
