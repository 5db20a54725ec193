"""What the probe sends: synthetic prompts of target token lengths, or prompts from a JSONL file.

Synthetic prompts are sequences of common short English words, each of which
is one token in the usual BPE vocabularies (Llama, Qwen, GPT, Mistral). The
chat template and tokenizer still add and merge a few, so the probe
calibrates: it sends two one-token requests of different lengths, reads the
server's ``prompt_tokens`` and fits tokens = a + b * words (see
:func:`fit_calibration`). Without usage in the replies the 1:1 guess stays and
the run says so.

Each request gets its own random words so that prefix caching does not make a
synthetic run look faster than real traffic; ``shared_prefix_fraction`` makes
that share of every prompt identical across requests, to measure exactly the
prefix-cache benefit.

A JSONL dataset line may hold ``prompt`` (text), ``messages`` (a chat
conversation, sent whole to the chat endpoint; the completions endpoint gets
the last user turn), and/or ``input_tokens`` /
``output_tokens`` (lengths only: a recorded length distribution replayed with
synthetic text). Lengths are drawn per request, deterministically from the seed.
A row may also carry a quality check (``expected`` + ``grader``, or a GSM8K /
multiple-choice shape): see :mod:`inferwise.probes.graders`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Literal

from inferwise.calculators.errors import InputError
from inferwise.probes.graders import Grader, read_grading

Distribution = Literal["fixed", "uniform", "normal", "lognormal"]

# One token each in common BPE vocabularies (with the leading space).
WORDS = (  # noqa: SIM905 - a word list reads better as text
    "the of and to in is for on that with as by at from this be are was it or an not but "
    "have has had all can one more new time will which their use also its may first any over "
    "about after two most some such these other into only many they than made make well work "
    "way year long part good best each high world great small large state under people water "
    "place point house case week company number group problem fact hand system program "
    "question government night money story month book right study line "
).split()


@dataclass(frozen=True)
class LengthSpec:
    """A token-length distribution: mean, and spread as a coefficient of variation
    (uniform: +-spread*mean; normal/lognormal: std = spread*mean)."""

    mean: int
    distribution: Distribution = "fixed"
    spread: float = 0.0
    minimum: int = 1

    def sample(self, rng: random.Random) -> int:
        m, s = float(self.mean), self.spread
        if self.distribution == "fixed" or s <= 0:
            x = m
        elif self.distribution == "uniform":
            x = rng.uniform(m * (1 - s), m * (1 + s))
        elif self.distribution == "normal":
            x = rng.gauss(m, s * m)
        else:
            sigma2 = math.log1p(s * s)
            x = rng.lognormvariate(math.log(m) - sigma2 / 2, math.sqrt(sigma2))
        return max(self.minimum, min(round(x), self.longest))

    @property
    def longest(self) -> int:
        """The cap on one draw: ten spreads above the mean (a lognormal's tail is
        unbounded; ten CVs out is beyond one draw in 10^5 for spreads up to 1)."""
        return max(self.minimum, round(self.mean * (1 + 10 * self.spread)))


@dataclass(frozen=True)
class PromptItem:
    text: str
    max_tokens: int | None
    target_input_tokens: int | None
    messages: list[dict[str, Any]] | None = None
    prompt_id: str | None = None
    grader: Grader | None = None


@dataclass(frozen=True)
class DatasetRow:
    prompt: str | None
    input_tokens: int | None
    output_tokens: int | None
    messages: list[dict[str, Any]] | None = None
    prompt_id: str | None = None
    grader: Grader | None = None
    """The row's quality check (probes/graders.py), compiled when the file is read."""


MAX_DATASET_BYTES = 512 << 20
"""Prompts are held in memory for the run: ShareGPT's largest JSON export is ~650 MB."""


def load_dataset(path: str) -> list[DatasetRow]:
    """Read a JSONL dataset; every problem is an InputError naming `dataset` and the line."""
    import stat

    from inferwise.calculators.files import MiB, expand_path, loads_json, stat_path

    p = expand_path(path)
    st = stat_path(p)
    if st is None or not stat.S_ISREG(st.st_mode):
        raise InputError("dataset", f"no regular file at {path}", "a JSONL file (a regular file)")
    if st.st_size > MAX_DATASET_BYTES:
        raise InputError(
            "dataset",
            f"{path} is {st.st_size / MiB:.0f} MiB; the limit is {MAX_DATASET_BYTES // MiB} MiB",
        )
    rows: list[DatasetRow] = []
    with p.open(encoding="utf-8", errors="replace") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            obj = loads_json(line, "dataset", f"line {n}")
            if not isinstance(obj, dict):
                raise InputError("dataset", f"line {n} is not a JSON object")
            graded = read_grading(obj, n)
            prompt = obj.get("prompt", graded.prompt)
            if prompt is None and isinstance(obj.get("messages"), list):
                users = [
                    m for m in obj["messages"] if isinstance(m, dict) and m.get("role") == "user"
                ]
                if users and isinstance(users[-1].get("content"), str):
                    prompt = users[-1]["content"]
            it, ot = obj.get("input_tokens"), obj.get("output_tokens")
            if prompt is not None and not isinstance(prompt, str):
                raise InputError("dataset", f"line {n}: prompt must be a string")
            for name, v in (("input_tokens", it), ("output_tokens", ot)):
                if v is not None and (not isinstance(v, int) or v < 1):
                    raise InputError("dataset", f"line {n}: {name} must be a positive integer")
            if prompt is None and it is None:
                raise InputError(
                    "dataset",
                    f"line {n} has neither prompt, messages, question nor input_tokens",
                    "prompt, messages, question, input_tokens",
                )
            messages = obj["messages"] if isinstance(obj.get("messages"), list) else None
            rows.append(DatasetRow(prompt, it, ot, messages, graded.prompt_id, graded.grader))
    if not rows:
        raise InputError("dataset", f"{path} holds no rows")
    return rows


def fit_calibration(points: list[tuple[int, int]]) -> tuple[float, float]:
    """(a, b) in tokens = a + b * words from (words, prompt_tokens) pairs."""
    if len(points) < 2 or points[0][0] == points[1][0]:
        w, t = points[0]
        return float(t - w), 1.0
    (w1, t1), (w2, t2) = points[0], points[1]
    b = (t2 - t1) / (w2 - w1)
    if b <= 0:
        b = 1.0
    return t1 - b * w1, b


class Workload:
    """Prompts per request index: lengths from the seed (the same seed gives the same
    load), text from the seed and a per-run salt.

    The salt exists because of prefix caching: a second run (or the next point
    of a sweep) sending the very same prompts would find them cached on the
    server and look faster than the first. The run sets a fresh salt
    (:meth:`new_salt`, stored with the run); the shared prefix changes with it."""

    def __init__(
        self,
        *,
        input_len: LengthSpec,
        output_len: LengthSpec | None,
        shared_prefix_fraction: float = 0.0,
        dataset: list[DatasetRow] | None = None,
        seed: int = 0,
        salt: int = 0,
        trace: Any = None,
    ) -> None:
        self.input_len = input_len
        self.output_len = output_len
        self.shared_prefix_fraction = shared_prefix_fraction
        self.dataset = dataset
        self.seed = seed
        self.overhead_tokens = 0.0  # chat template / BOS tokens the server adds
        self.tokens_per_word = 1.0
        self.calibrated = False
        self.trace = trace
        """A TracePrompts (probes.trace_replay) when the run replays a trace."""
        self.set_salt(salt)

    @classmethod
    def of_probe(cls, req: Any, dataset: list[DatasetRow] | None, trace: Any = None) -> Workload:
        """The load a ProbeRequest describes (prompt and output lengths, shared prefix,
        seed), over `dataset` when it has one, or the requests of a trace."""
        prompts = None
        if trace is not None:
            from inferwise.probes.trace_replay import TracePrompts

            prompts = TracePrompts(trace, req.warmup_requests)
        return cls(
            input_len=LengthSpec(req.input_tokens, req.input_distribution, req.input_spread),
            output_len=LengthSpec(req.output_tokens, req.output_distribution, req.output_spread),
            shared_prefix_fraction=req.shared_prefix_fraction,
            dataset=dataset,
            seed=req.seed,
            trace=prompts,
        )

    def set_salt(self, salt: int) -> None:
        self.salt = salt
        self._shared: list[str] = []
        self._shared_rng = random.Random(f"shared-{self.seed}-{salt}")

    def new_salt(self) -> int:
        import secrets

        self.set_salt(secrets.randbits(32))
        return self.salt

    def calibrate(self, a: float, b: float) -> None:
        self.overhead_tokens, self.tokens_per_word, self.calibrated = a, b, True

    def words_for(self, tokens: int) -> int:
        return max(1, round((tokens - self.overhead_tokens) / self.tokens_per_word))

    @staticmethod
    def _words(rng: random.Random, n: int) -> list[str]:
        return rng.choices(WORDS, k=n)

    def _shared_prefix(self, n: int) -> list[str]:
        if len(self._shared) < n:  # extend the one sequence, so shorter prefixes stay prefixes
            self._shared += self._words(self._shared_rng, n - len(self._shared))
        return self._shared[:n]

    def synthetic_text(self, rng: random.Random, tokens: int) -> str:
        n = self.words_for(tokens)
        shared = min(n, round(n * self.shared_prefix_fraction))
        words = self._shared_prefix(shared) + self._words(rng, n - shared)
        return " ".join(words)

    def item(self, index: int) -> PromptItem:
        if self.trace is not None:
            return self.trace.item(self, index)
        rng = random.Random((self.seed << 32) ^ index)
        text_rng = random.Random(f"text-{self.seed}-{self.salt}-{index}")
        out = self.output_len.sample(rng) if self.output_len else None
        if self.dataset:
            row = self.dataset[index % len(self.dataset)]
            if row.output_tokens is not None:  # a recorded length beats the synthetic one
                out = row.output_tokens
            if row.prompt is not None:
                return PromptItem(
                    row.prompt, out, row.input_tokens, row.messages, row.prompt_id, row.grader
                )
            assert row.input_tokens is not None
            return PromptItem(
                self.synthetic_text(text_rng, row.input_tokens), out, row.input_tokens
            )
        target = self.input_len.sample(rng)
        return PromptItem(self.synthetic_text(text_rng, target), out, target)
