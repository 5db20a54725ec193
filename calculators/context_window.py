"""The context window predict and budget assume when the user did not set one.

A user asking "how fast is a 1,200-token request on one L4?" rarely cares that
the model's default window (often 131k tokens) does not fit beside the weights;
vLLM would refuse to start at that default, but the same server started with a
shorter ``--max-model-len`` answers the question. So when ``max_model_len`` is
not given and the default does not fit, predict and budget assume the longest
context that fits (the fit calculator's ``estimated_max_model_len``, vLLM's own
estimate) and say so in the assumptions. A workload that needs more than that
still fails, with the numbers. An explicit ``max_model_len`` is never changed.
"""

from __future__ import annotations

from typing import Any, TypeVar

from .errors import InputError

R = TypeVar("R")

BLOCK_TOKENS = 16  # vLLM's paged-KV block; a window on a block boundary wastes nothing


def workload_need_tokens(req: Any) -> int:
    """Context one request of the workload needs: its longest prompt plus output."""
    longest_in = getattr(req, "input_tokens_p95", None) or getattr(req, "input_tokens", 1)
    longest_out = getattr(req, "output_tokens_p95", None) or getattr(req, "output_tokens", 1)
    return int(longest_in) + int(longest_out)


def largest_fitting_context(req: Any) -> int | None:
    """The longest max_model_len that fits this deployment (None when the window is not
    what fails: the weights alone do not fit, or it fits already). For vLLM, under the
    first install fact the request leaves unsaid that leaves room for any context (the
    sampler, the MXFP4 MoE kernel: roofline.OPEN_FACT_PINS), as the step model does:
    gpt-oss-120b on one H100 with vLLM 0.11 fits only with FlashInfer's sampler, whose
    warm-up is smaller than PyTorch's, and GPUStack served it so."""
    from .deployment import Deployment
    from .fit import FitRequest, estimate_fit
    from .roofline import OPEN_FACT_PINS

    fields = {k: getattr(req, k) for k in Deployment.model_fields}
    pins = ({}, *OPEN_FACT_PINS) if fields["engine"] == "vllm" else ({},)
    for pin in pins:
        fit = estimate_fit(FitRequest(**{**fields, **pin}), with_suggestions=False)
        if fit.fits:
            return None
        if fit.estimated_max_model_len:
            return int(fit.estimated_max_model_len) // BLOCK_TOKENS * BLOCK_TOKENS or None
    return None


def with_fitting_context(req: R, need: int | None = None) -> tuple[R, str | None]:
    """`req` with max_model_len set to the longest context that fits when the model's
    default does not (and the user gave none), and the assumption saying so.

    Returns `req` unchanged and None when max_model_len was given or the default fits.
    Raises InputError when even the workload's own need (``need`` tokens, else
    :func:`workload_need_tokens` of `req`) does not fit.
    """
    from .roofline import StepModel

    if getattr(req, "max_model_len", None) is not None:
        return req, None
    try:
        StepModel.from_deployment(req)  # type: ignore[arg-type]
        return req, None
    except InputError as exc:
        if exc.field != "model":
            raise
        longest = largest_fitting_context(req)
        if longest is None:
            raise
    need = workload_need_tokens(req) if need is None else need
    if longest < need:
        raise InputError(
            "max_model_len",
            f"the workload needs a context of {need:,} tokens (longest input + output) but at "
            f"most {longest:,} tokens fit beside the weights on this deployment",
            accepted="fewer tokens, more GPUs or tensor parallelism, a quantized model or "
            "kv_cache_dtype fp8",
        )
    note = (
        f"max_model_len not given and the model's default context does not fit: assumed "
        f"{longest:,} tokens, the longest that fits (the workload needs {need:,}); "
        f"serve with --max-model-len {longest}"
    )
    return req.model_copy(update={"max_model_len": longest}), note  # type: ignore[attr-defined]
