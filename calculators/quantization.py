"""Weight quantization schemes: bytes per parameter and which modules they skip.

A checkpoint's ``quantization_config`` (or the ``--quantization`` flag) says
how linear-layer weights are stored. What matters for memory is the storage
cost per weight, *including* its scales and zero points (an INT4 weight with
one fp16 scale per 128 weights costs 0.5 + 2/128 bytes, not 0.5), and which
modules stay unquantized: engines keep embeddings, ``lm_head``, norms and MoE
routers at the model dtype unless the checkpoint says otherwise, and
checkpoints list more exceptions in ``modules_to_not_convert`` / ``ignore``.

Public API: :func:`resolve_quantization` -> :class:`QuantScheme`;
``QuantScheme.bytes_per_param`` and ``QuantScheme.skips(module_name)``.
Stdlib only.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from .errors import InputError

DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
}

SUPPORTED_METHODS = (
    "none",
    "fp8",
    "fbgemm_fp8",
    "ptpc_fp8",
    "modelopt",
    "modelopt_fp4",
    "nvfp4",
    "compressed-tensors",
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "mxfp4",
    "bitsandbytes",
    "int8",
    "experts_int8",
    "int4",
)
INT4_WHAT_IF = "int4"
"""A what-if for an unquantized checkpoint: the same model as a W4A16 INT4 checkpoint
(AWQ/GPTQ-style, group size 128), which has to be made or found before it is served."""


def dtype_bytes(dtype: str, field_name: str = "dtype") -> float:
    """Bytes per element of an unquantized weight dtype name."""
    try:
        return DTYPE_BYTES[dtype.lower().removeprefix("torch.")]
    except KeyError:
        raise InputError(
            field_name, f"unknown dtype '{dtype}'", accepted=", ".join(sorted(DTYPE_BYTES))
        ) from None


@dataclass(frozen=True)
class QuantScheme:
    """How quantized linear weights are stored.

    ``bytes_per_param`` covers the packed weight plus its scales and zero
    points, amortised per weight. ``ignore`` patterns name modules that stay
    at the model dtype; ``quantize_embeddings`` is true only for formats
    that quantize the vocabulary matrices too (GGUF-like, not supported).
    """

    method: str
    bytes_per_param: float
    description: str
    ignore: tuple[str, ...] = ()
    experts_only: bool = False
    """MXFP4 checkpoints (gpt-oss) quantize only the MoE experts."""
    notes: tuple[str, ...] = field(default=())
    activation_dtype: str | None = None
    """The dtype a compressed-tensors checkpoint quantizes the GEMM inputs to ("fp8",
    "int8", "fp4"), None where they stay 16-bit (W8A16, W4A16): whether the engine runs
    low-precision tensor-core GEMMs or dequantizes the weights for 16-bit ones depends on
    it, not on the weights' dtype. The other methods imply theirs by name."""
    block_scaled: bool = False
    """FP8 weights with a scale per block of weights (``weight_block_size`` [128, 128], the
    DeepSeek-V3 layout, or compressed-tensors' ``block`` strategy) and activations quantized
    per group of 128 at run time: the engines run them in block-scaled GEMM kernels, which do
    not reach the per-tensor FP8 rate (``Efficiency.block_fp8_fraction``)."""

    @property
    def is_quantized(self) -> bool:
        return self.method != "none"

    def skips(self, module: str) -> bool:
        """Whether ``module`` (an HF-style dotted name) stays unquantized."""
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], module):
                    return True
            elif "*" in pattern or "?" in pattern:
                if fnmatch.fnmatchcase(module, pattern) or fnmatch.fnmatchcase(
                    module, pattern + ".*"
                ):
                    return True
            elif (
                module == pattern
                or module.startswith(pattern + ".")
                or module.endswith("." + pattern)
            ):
                return True
        return False


NONE = QuantScheme("none", 0.0, "unquantized")


def _int_scheme(bits: int, group_size: int | None, scale_bytes: float, zero_bits: float) -> float:
    """Packed ``bits``-bit weights with one scale (and zero point) per group.

    ``group_size`` None or <= 0 means one scale per output channel, which is
    negligible per weight and counted as zero.
    """
    per = bits / 8
    if group_size and group_size > 0:
        per += (scale_bytes + zero_bits / 8) / group_size
    return per


def _fp8_block_overhead(block: Any) -> float:
    """fp32 scale per weight block (e.g. 128x128 -> 4/16384 bytes per weight)."""
    if (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(b, int) and b > 0 for b in block)
    ):
        return 4.0 / (block[0] * block[1])
    return 0.0


def _ignore_list(cfg: dict[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    for key in (
        "modules_to_not_convert",
        "ignore",
        "ignored_layers",
        "exclude_modules",
        "llm_int8_skip_modules",
    ):
        value = cfg.get(key)
        if isinstance(value, list):
            out.extend(str(v) for v in value)
    return tuple(out)


def _compressed_tensors(cfg: dict[str, Any]) -> QuantScheme:
    groups = cfg.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise InputError("quantization", "compressed-tensors config has no config_groups")
    # Several groups may target different layers; the largest-footprint
    # group is taken for all linear layers (conservative) and said so.
    best: tuple[float, str, str | None, bool] | None = None
    for name, group in groups.items():
        weights = (group or {}).get("weights") or {}
        acts = _activation_dtype((group or {}).get("input_activations"))
        bits = int(weights.get("num_bits", 8))
        wtype = str(weights.get("type", "int"))
        strategy = str(weights.get("strategy", "tensor"))
        gsize = weights.get("group_size")
        if wtype == "float" and bits == 4:
            per = 0.5 + 1 / 16  # NVFP4: fp8 scale per 16 weights
            desc = "NVFP4"
        elif wtype == "float":
            per = 1.0 + (
                _fp8_block_overhead(weights.get("block_structure")) if strategy == "block" else 0.0
            )
            desc = f"FP8 {strategy}"
        else:
            zero_bits = 0 if weights.get("symmetric", True) else bits
            per = _int_scheme(bits, gsize if strategy == "group" else None, 2, zero_bits)
            desc = f"INT{bits} {strategy}{f' g{gsize}' if gsize else ''}"
        label = f"W{bits}A{_ACTIVATION_BITS.get(acts, 16)}"
        if best is None or per > best[0]:
            block = wtype == "float" and bits == 8 and strategy == "block"
            best = (per, f"{desc} {label} (compressed-tensors) [{name}]", acts, block)
    assert best is not None
    notes = (
        ("several compressed-tensors groups: the largest per-weight cost applied to all",)
        if len(groups) > 1
        else ()
    )
    return QuantScheme(
        "compressed-tensors",
        best[0],
        best[1],
        _ignore_list(cfg),
        notes=notes,
        activation_dtype=best[2],
        block_scaled=best[3],
    )


_ACTIVATION_DTYPES = {(8, "float"): "fp8", (8, "int"): "int8", (4, "float"): "fp4"}
"""compressed-tensors ``input_activations`` (num_bits, type) -> the GEMM input dtype."""
_ACTIVATION_BITS = {dtype: bits for (bits, _), dtype in _ACTIVATION_DTYPES.items()}


def _activation_dtype(acts: Any) -> str | None:
    """A compressed-tensors group's ``input_activations`` as the dtype its GEMMs take in:
    absent or 16-bit means the weights are dequantized for a 16-bit GEMM (W8A16, W4A16)."""
    if not isinstance(acts, dict) or not isinstance(acts.get("num_bits"), int):
        return None
    return _ACTIVATION_DTYPES.get((acts["num_bits"], acts.get("type", "int")))


def modelopt_field(cfg: dict[str, Any], key: str) -> Any:
    """A ModelOpt quantization field (``quant_algo``, ``kv_cache_quant_algo``): at the top of
    ``quantization_config`` in newer exports, under its ``quantization`` table in the
    hf_quant_config.json of older ones."""
    nested = cfg.get("quantization")
    return cfg.get(key) or (nested.get(key) if isinstance(nested, dict) else None)


def scheme_from_config(cfg: dict[str, Any]) -> QuantScheme:
    """Interpret a checkpoint's ``quantization_config``."""
    method = str(cfg.get("quant_method", "")).lower()
    ignore = _ignore_list(cfg)
    if method in ("fp8", "fbgemm_fp8"):
        return QuantScheme(
            "fp8",
            1.0 + _fp8_block_overhead(cfg.get("weight_block_size")),
            "FP8 e4m3 weights"
            + (
                f", {cfg['weight_block_size']} block scales" if cfg.get("weight_block_size") else ""
            ),
            ignore,
            block_scaled=bool(cfg.get("weight_block_size")),
        )
    if method in ("awq", "awq_marlin", "gptq", "gptq_marlin"):
        bits = int(cfg.get("bits", cfg.get("w_bit", 4)))
        gsize = int(cfg.get("group_size", cfg.get("q_group_size", 128)) or -1)
        zero = method.startswith("awq") or not cfg.get("sym", True)
        # GPTQ stores packed int4 zeros even when symmetric; AWQ stores them too.
        zero_bits = bits
        per = _int_scheme(bits, gsize, 2, zero_bits)
        name = "AWQ" if method.startswith("awq") else "GPTQ"
        return QuantScheme(
            method.removesuffix("_marlin"),
            per,
            f"{name} INT{bits}, group size {gsize if gsize > 0 else 'per-channel'}"
            + (", zero points" if zero else ""),
            ignore,
        )
    if method == "compressed-tensors":
        return _compressed_tensors(cfg)
    if method == "mxfp4":
        return QuantScheme(
            "mxfp4",
            0.5 + 1 / 32,
            "MXFP4 experts (4-bit, one E8M0 scale per 32 weights)",
            ignore,
            experts_only=True,
        )
    if method in ("modelopt", "modelopt_fp4"):  # the second as the catalog and vLLM resolve it
        default = "NVFP4" if method == "modelopt_fp4" else "FP8"
        algo = str(modelopt_field(cfg, "quant_algo") or default).upper()
        if "FP4" in algo:
            return QuantScheme("modelopt_fp4", 0.5 + 1 / 16, "NVFP4 (ModelOpt)", ignore)
        return QuantScheme("modelopt", 1.0, "FP8 per-tensor (ModelOpt)", ignore)
    if method == "bitsandbytes":
        if cfg.get("load_in_8bit"):
            return QuantScheme("bitsandbytes", 1.0, "bitsandbytes INT8", ignore)
        double = bool(cfg.get("bnb_4bit_use_double_quant"))
        per = 0.5 + (1 / 64 + 4 / (64 * 256) if double else 4 / 64)
        return QuantScheme(
            "bitsandbytes",
            per,
            "bitsandbytes NF4, block 64" + (", double quant" if double else ""),
            ignore,
        )
    raise InputError(
        "quantization",
        f"quantization method '{method or 'unknown'}' in the checkpoint is not supported",
        accepted=", ".join(SUPPORTED_METHODS),
    )


def resolve_quantization(flag: str | None, checkpoint_config: dict[str, Any] | None) -> QuantScheme:
    """The scheme the engine will use: the checkpoint's, unless the flag asks
    for on-the-fly quantization of an unquantized checkpoint (vLLM
    ``--quantization fp8`` / ``bitsandbytes`` / ``experts_int8``)."""
    if checkpoint_config:
        scheme = scheme_from_config(checkpoint_config)
        if flag and flag.lower() not in ("none",) and not _compatible(flag.lower(), scheme.method):
            raise InputError(
                "quantization",
                f"'{flag}' does not match the checkpoint's quantization '{scheme.method}'; "
                "omit --quantization to use the checkpoint's",
            )
        return scheme
    if flag is None or flag.lower() == "none":
        return NONE
    method = flag.lower()
    if method in ("fp8", "ptpc_fp8", "fbgemm_fp8"):
        return QuantScheme("fp8", 1.0, "FP8 weights quantized at load time (per-tensor)")
    if method in ("int8", "experts_int8"):
        return QuantScheme(
            method,
            1.0,
            "INT8 weights quantized at load time",
            experts_only=method == "experts_int8",
        )
    if method == INT4_WHAT_IF:
        return QuantScheme(
            INT4_WHAT_IF,
            _int_scheme(4, 128, 2.0, 4.0),
            "INT4 weights, group size 128 (what-if: an AWQ/GPTQ checkpoint of this model, "
            "served with vLLM's Marlin kernels; quality must be re-evaluated)",
        )
    if method == "bitsandbytes":
        return QuantScheme(
            "bitsandbytes", 0.5 + 4 / 64, "bitsandbytes NF4 quantized at load time, block 64"
        )
    if method in (
        "awq",
        "gptq",
        "compressed-tensors",
        "mxfp4",
        "modelopt",
        "modelopt_fp4",
        "nvfp4",
        "awq_marlin",
        "gptq_marlin",
    ):
        raise InputError(
            "quantization",
            f"'{flag}' needs a checkpoint quantized that way (its config.json has a quantization_config); "
            "this model's config has none",
        )
    raise InputError(
        "quantization", f"unknown quantization '{flag}'", accepted=", ".join(SUPPORTED_METHODS)
    )


def _compatible(flag: str, method: str) -> bool:
    flag = flag.removesuffix("_marlin")
    return (
        flag == method
        or {flag, method} <= {"fp8", "fbgemm_fp8", "modelopt"}
        or ({flag, method} <= {"modelopt_fp4", "nvfp4", "compressed-tensors"})
    )
