"""What grading and hashing add to one request, in microseconds.

Every completed request's output is hashed (``output_sha256``) and, when its dataset
row has a grader, graded, in ``to_record`` after the response ended: on the probe's
event loop, between two streams' byte stamps. This prints the cost per request of
each grader on a typical answer of about 125 words, so it can be set
against the probe's timing-precision budget (bench/probe_precision.py: median TTFT
error <= 2 ms at c=1, <= 5 ms at c=64).

Usage: ``python bench/grader_cost.py``

Measured 2026-12-02 on the 2-core dev box (load average ~3.5), a 476-character answer:
hash 1.2 us; exact 0.2, contains 0.8, regex 0.8, numeric 23.5, choice 4.1, json_schema
10.3 us per request. bench/probe_precision.py (which stores texts, so it hashes every
output), before -> after this change: c=1 TTFT error median/p90/p99 +0.28/+2.24/+4.57 ->
+0.35/+2.12/+6.52 ms, c=64 +0.53/+3.22/+28.64 -> +0.50/+2.45/+4.91 ms, ITL error
median 0.001 -> 0.002 ms: within run-to-run noise.
"""

from __future__ import annotations

import json
import random
import timeit

from inferwise.probes.graders import output_hash, read_grading


def main() -> None:
    rng = random.Random(0)
    words = [
        "the",
        "of",
        "and",
        "to",
        "in",
        "is",
        "for",
        "on",
        "that",
        "with",
        "as",
        "by",
        "at",
        "from",
        "this",
        "be",
        "are",
        "was",
    ]
    text = " ".join(rng.choice(words) for _ in range(124)) + " so the answer is 42."
    doc = json.dumps({"answer": 42, "why": text[:400]})
    rows = {
        "exact": ({"prompt": "p", "expected": "42", "grader": "exact"}, text),
        "contains": ({"prompt": "p", "expected": "answer is 42", "grader": "contains"}, text),
        "regex": ({"prompt": "p", "expected": r"answer is (\d+)", "grader": "regex"}, text),
        "numeric": ({"prompt": "p", "expected": 42, "grader": "numeric"}, text),
        "choice": ({"prompt": "p", "expected": "B", "grader": "choice"}, text + " Answer: B"),
        "json_schema": (
            {
                "prompt": "p",
                "grader": "json_schema",
                "schema": {"type": "object", "required": ["answer"]},
            },
            doc,
        ),  # fmt: skip
    }
    n = 2000
    print(f"output {len(text)} characters; microseconds per request (best of 5 x {n})")
    t = min(timeit.repeat(lambda: output_hash(text), number=n, repeat=5)) / n
    print(f"  {'hash':<12} {t * 1e6:8.1f}")
    for name, (row, out) in rows.items():
        grader = read_grading(row, 1).grader
        assert grader is not None
        t = min(timeit.repeat(lambda g=grader, o=out: g.grade(o), number=n, repeat=5)) / n
        print(f"  {name:<12} {t * 1e6:8.1f}")


if __name__ == "__main__":
    main()
