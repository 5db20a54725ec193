"""The GPU and model catalogs, and loading a model from a local path.

Both catalogs are facts copied from their sources (vendor datasheets, the
Hugging Face ``config.json`` of each model) so the calculators never guess a
hardware figure or an architecture field. Each entry carries its source URL
so an answer can be verified.

Look-ups are forgiving in spelling (case, the names ``nvidia-smi`` prints,
short names like ``h100``) and strict in meaning: anything not found is an
``InputError`` that lists the closest known entries, never a silent default.

Stdlib only: the MCP server imports this at start-up.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .checkpoint_tensors import TensorTable

from .errors import InputError
from .files import MiB, expand_path, loads_json, path_exists, read_text
from .quantization import modelopt_field

DATA_DIR = Path(__file__).parent / "data"
GPU_FILE = DATA_DIR / "gpus.toml"
MODELS_DIR = DATA_DIR / "models"

DTYPE_KEYS = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp6", "fp4", "int4")
"""Keys of ``GPU.dense_tflops`` (TFLOPS for floats, TOPS for integers)."""

INTERCONNECTS = ("nvlink", "xgmi", "pcie", "nvlink-bridge")

# Words that nvidia-smi / rocm-smi put in front of the product name. A name is
# also tried without them, so "NVIDIA L40S" and "AMD Instinct MI300X" resolve
# through the ids "l40s" and "mi300x" without listing every spelling.
_VENDOR_PREFIXES = (
    "nvidia-geforce-",
    "geforce-",
    "nvidia-tesla-",
    "tesla-",
    "nvidia-",
    "amd-instinct-",
    "instinct-",
    "amd-radeon-",
    "amd-",
)


@dataclass(frozen=True)
class GPU:
    """One accelerator, per device (one GPU, or one package where the vendor
    presents a package as one device, see ``notes``)."""

    id: str
    name: str
    vendor: str
    memory_gb_vendor: float
    """Capacity as the vendor states it ("80GB"). Read it as decimal GB, but
    note that HBM parts are built in binary units (A100 80GB = 81,920 MiB);
    use ``memory_total_gib`` for anything that must fit."""
    memory_total_gib: float
    """Total the runtime reports (``torch.cuda.mem_get_info()[1]`` / 2^30,
    nvidia-smi MiB / 1024); smaller than the vendor figure (ECC, reserved)."""
    memory_bandwidth_gb_per_s: float
    """Vendor figure, 10^9 bytes per second."""
    dense_tflops: dict[str, float]
    """Dense (not 2:4 sparse) peak throughput per dtype, TFLOPS (TOPS for int)."""
    interconnect: str
    """``nvlink`` | ``xgmi`` | ``pcie`` | ``nvlink-bridge``."""
    interconnect_bandwidth_gb_per_s: float
    """Per GPU, one direction, 10^9 bytes/s (vendors often quote both
    directions added: NVLink 4 "900 GB/s" is 450 here)."""
    pcie_gen: int
    source_url: str
    aliases: tuple[str, ...] = ()
    notes: str = ""
    tdp_w: float | None = None
    """Maximum board / module power in watts, when the datasheet gives it."""
    extra_source_urls: tuple[str, ...] = field(default=())
    memory_total_gib_torch: float | None = None
    """Total torch reports (``torch.cuda.mem_get_info()[1]`` / 2^30, the
    total vLLM logs and budgets from) where logs give it; below nvidia-smi's."""


@dataclass(frozen=True)
class ModelSource:
    """A model's architecture facts as the calculators read them."""

    hf_id: str
    """Hugging Face id for catalog entries; the path for local models."""
    config: dict[str, Any]
    """The real ``config.json`` content, unflattened (multimodal models keep
    ``text_config`` / ``vision_config``). One addition, as vLLM makes it: a
    ModelOpt checkpoint without ``quantization_config`` gets the content of its
    ``hf_quant_config.json`` there, with the resolved ``quant_method``."""
    source_url: str
    checkpoint_bytes: int | None
    """Exact checkpoint size when known: ``model.safetensors.index.json``
    ``metadata.total_size`` (tensor bytes), or the safetensors file sizes."""
    origin: str
    """``catalog`` | ``path`` | ``hub``."""
    notes: str = ""
    hf_quant_config: dict[str, Any] | None = None
    """Content of ``hf_quant_config.json`` when the checkpoint has one (NVIDIA
    ModelOpt checkpoints keep their quantization there, not in config.json)."""
    revision: str | None = None
    """The Hub commit the config was read at (``hub`` origin)."""
    resolution: str = ""
    """Where the facts came from, in words, for the result's assumptions."""
    tensors: TensorTable | None = None
    """Every checkpoint tensor's dtype and shape, from the safetensors headers (local
    files or Hub range requests), when they could be read."""


# --------------------------------------------------------------------------- GPUs


def _norm(name: str) -> str:
    """Case, spaces, underscores and dashes do not distinguish two GPUs."""
    return re.sub(r"[\s_\-/]+", "-", name.strip().lower()).strip("-")


def _gpu_from_table(gpu_id: str, row: dict[str, Any]) -> GPU:
    try:
        gpu = GPU(
            id=gpu_id,
            name=str(row["name"]),
            vendor=str(row["vendor"]),
            memory_gb_vendor=float(row["memory_gb_vendor"]),
            memory_total_gib=float(row["memory_total_gib"]),
            memory_bandwidth_gb_per_s=float(row["memory_bandwidth_gb_per_s"]),
            dense_tflops={str(k): float(v) for k, v in row["dense_tflops"].items()},
            interconnect=str(row["interconnect"]),
            interconnect_bandwidth_gb_per_s=float(row["interconnect_bandwidth_gb_per_s"]),
            pcie_gen=int(row["pcie_gen"]),
            source_url=str(row["source_url"]),
            aliases=tuple(str(a) for a in row.get("aliases", ())),
            notes=str(row.get("notes", "")),
            tdp_w=float(row["tdp_w"]) if row.get("tdp_w") is not None else None,
            extra_source_urls=tuple(str(u) for u in row.get("extra_source_urls", ())),
            memory_total_gib_torch=(
                float(row["memory_total_gib_torch"]) if "memory_total_gib_torch" in row else None
            ),
        )
    except KeyError as exc:  # a broken catalog is our bug, but say where
        raise ValueError(f"{GPU_FILE}: GPU '{gpu_id}' lacks field {exc}") from exc
    return gpu


@lru_cache(maxsize=1)
def _gpus() -> tuple[GPU, ...]:
    with GPU_FILE.open("rb") as fh:
        table = tomllib.load(fh)
    return tuple(_gpu_from_table(gpu_id, row) for gpu_id, row in table.items())


@lru_cache(maxsize=1)
def _gpu_index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in _gpus():
        for key in (gpu.id, gpu.name, *gpu.aliases):
            k = _norm(key)
            other = index.get(k)
            if other is not None and other.id != gpu.id:
                raise ValueError(f"{GPU_FILE}: name '{key}' is used by {other.id} and {gpu.id}")
            index[k] = gpu
    return index


def list_gpus() -> list[GPU]:
    """Every catalogued GPU, in catalog order."""
    return list(_gpus())


def get_gpu(name: str) -> GPU:
    """Find a GPU by id, alias or the name nvidia-smi / rocm-smi prints."""
    index = _gpu_index()
    key = _norm(name)
    if key in index:
        return index[key]
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and key[len(prefix) :] in index:
            return index[key[len(prefix) :]]
    ids = [g.id for g in _gpus()]
    # Names that extend what was typed ("h10" -> the H100s) first, then the
    # nearest spellings.
    close = [k for k in index if k.startswith(key)] if len(key) >= 2 else []
    close += difflib.get_close_matches(key, list(index), n=8, cutoff=0.5)
    suggestions: list[str] = []
    for k in close:
        if index[k].id not in suggestions:
            suggestions.append(index[k].id)
    closest = ", ".join(suggestions[:3]) if suggestions else "none"
    raise InputError("gpu", f"unknown GPU '{name}'; closest: {closest}", accepted=", ".join(ids))


# --------------------------------------------------------------------------- models


MAX_CONFIG_BYTES = 16 * MiB
"""config.json files are kilobytes; a safetensors index of a 1T-parameter model is ~2 MiB."""


def _read_json(path: Path, field_name: str = "model") -> Any:
    return loads_json(read_text(path, field_name, MAX_CONFIG_BYTES), field_name, str(path))


@lru_cache(maxsize=1)
def _models() -> tuple[ModelSource, ...]:
    models = []
    for path in sorted(MODELS_DIR.glob("*.json")):
        entry = json.loads(path.read_text(encoding="utf-8"))
        config, how = _with_modelopt_quantization(entry["config"], entry.get("hf_quant_config"))
        models.append(
            ModelSource(
                hf_id=entry["hf_id"],
                config=config,
                source_url=entry["source_url"],
                checkpoint_bytes=entry.get("checkpoint_bytes"),
                origin="catalog",
                notes=" ".join(n for n in (entry.get("notes", ""), how) if n),
                hf_quant_config=entry.get("hf_quant_config"),
            )
        )
    return tuple(models)


@lru_cache(maxsize=1)
def _model_index() -> tuple[dict[str, ModelSource], dict[str, list[ModelSource]]]:
    """Full ids (lower-case) and the part after the slash, which may be shared."""
    by_id: dict[str, ModelSource] = {}
    by_name: dict[str, list[ModelSource]] = {}
    for m in _models():
        by_id[m.hf_id.lower()] = m
        by_name.setdefault(m.hf_id.split("/")[-1].lower(), []).append(m)
    return by_id, by_name


def _with_modelopt_quantization(
    config: dict[str, Any], hf_quant_config: dict[str, Any] | None
) -> tuple[dict[str, Any], str]:
    """Give the config the quantization_config vLLM gives it.

    ModelOpt exports up to 0.29 keep their quantization in a separate
    ``hf_quant_config.json``; vLLM's config loader copies that file into
    ``quantization_config`` when config.json has none, and its ModelOpt config
    class then resolves the method from ``quantization.quant_algo`` (FP8 ->
    ``modelopt``, NVFP4 -> ``modelopt_fp4``). We do the same and write the
    resolved method into ``quant_method`` so the calculators read one field.
    """
    if not hf_quant_config or config.get("quantization_config"):
        return config, ""
    algo = str(modelopt_field(hf_quant_config, "quant_algo") or "").upper()
    method = "modelopt_fp4" if "FP4" in algo else "modelopt"
    config = {**config, "quantization_config": {**hf_quant_config, "quant_method": method}}
    return config, (
        f"quantization_config taken from hf_quant_config.json (as vLLM does), "
        f"quant_method '{method}' resolved from quant_algo '{algo}'"
    )


def _fresh(model: ModelSource) -> ModelSource:
    """A copy whose config the caller may change without touching the cache."""
    return dataclasses.replace(
        model,
        config=copy.deepcopy(model.config),
        hf_quant_config=copy.deepcopy(model.hf_quant_config),
    )


def list_models() -> list[ModelSource]:
    """Every catalogued model, sorted by file name (org--name)."""
    return [_fresh(m) for m in _models()]


def _index_total_size(index_path: Path) -> int | None:
    """A shard index's ``metadata.total_size``: the checkpoint's tensor bytes."""
    index = _read_json(index_path)
    total = index.get("metadata", {}).get("total_size") if isinstance(index, dict) else None
    return int(total) if isinstance(total, int | float) and total > 0 else None


def _checkpoint_bytes(folder: Path) -> tuple[int | None, str]:
    """Exact checkpoint size of a local model folder, and how it was found.

    The index's ``metadata.total_size`` counts tensor bytes only, which is what
    the weights occupy on the GPU; summing file sizes adds the small JSON
    headers, so it is only the fallback.
    """
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index_path = folder / index_name
        total = _index_total_size(index_path) if index_path.is_file() else None
        if total:
            return total, f"checkpoint bytes from {index_name} metadata.total_size"
    files = sorted(folder.glob("*.safetensors"))
    if files:
        total = sum(f.stat().st_size for f in files)
        return total, (
            f"checkpoint bytes = size of {len(files)} .safetensors file(s) "
            "(includes their small JSON headers)"
        )
    return None, ""


def _hf_cache_snapshot(folder: Path) -> Path | None:
    """A Hugging Face cache folder (``models--org--name``) keeps its files in
    ``snapshots/<revision>/``; use the newest snapshot that has a config.json."""
    snapshots = folder / "snapshots"
    if not snapshots.is_dir():
        return None
    candidates = [d for d in snapshots.iterdir() if (d / "config.json").is_file()]
    return max(candidates, key=lambda d: d.stat().st_mtime) if candidates else None


def _load_path(path: Path) -> ModelSource:
    path = path.expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            path = _hf_cache_snapshot(path) or path
        config_path = path / "config.json"
        if not config_path.is_file():
            raise InputError(
                "model",
                f"folder {path} has no config.json; pass a Hugging Face model folder "
                "or the path of its config.json",
            )
        folder = path
    else:
        config_path = path
        folder = path.parent
    config = _read_json(config_path)
    if not isinstance(config, dict):
        raise InputError("model", f"{config_path} must hold a JSON object (a config.json)")
    if "model_type" not in config and "architectures" not in config:
        raise InputError(
            "model",
            f"{config_path} has neither 'model_type' nor 'architectures'; "
            "is it a Hugging Face config.json?",
        )
    checkpoint_bytes, how = _checkpoint_bytes(folder)
    tensors, unreadable = _local_tensors(folder)
    if tensors is not None:
        checkpoint_bytes = tensors.total_bytes
        how = f"checkpoint measured from the headers of its safetensors files ({_counts(tensors)})"
    quant_path = folder / "hf_quant_config.json"
    hf_quant_config = _read_json(quant_path) if quant_path.is_file() else None
    if not isinstance(hf_quant_config, dict):
        hf_quant_config = None
    config, quant_how = _with_modelopt_quantization(config, hf_quant_config)
    return ModelSource(
        hf_id=str(path),
        config=config,
        source_url=config_path.resolve().as_uri(),
        checkpoint_bytes=checkpoint_bytes,
        origin="path",
        notes="; ".join(n for n in (how, quant_how) if n),
        hf_quant_config=hf_quant_config,
        tensors=tensors,
        resolution=unreadable,
    )


def _local_tensors(folder: Path) -> tuple[TensorTable | None, str]:
    """The folder's tensor table; a header that does not parse leaves the config
    arithmetic in charge (the fit needs no weights) and says why."""
    from .checkpoint_tensors import read_folder

    try:
        return read_folder(folder), ""
    except InputError as exc:
        return None, f"safetensors headers not used ({exc.message}); weights from config.json"


def _counts(table: TensorTable) -> str:
    return ", ".join(f"{n:,} {d}" for d, n in table.parameters_by_dtype().items())


def _looks_like_path(spec: str) -> bool:
    return (
        spec.endswith(".json")
        or spec.startswith(("/", "./", "../", "~", "\\"))
        or (len(spec) > 1 and spec[1] == ":")
        or spec.count("/") > 1
    )


def load_model(spec: str, *, fresh: bool = True, revision: str | None = None) -> ModelSource:
    """A model's config, from the first place that has it: a local ``config.json`` or model
    folder; the Hugging Face Hub (a repository id, at `revision`; cached, config files only);
    the shipped catalog (by id, or the part after the slash when unambiguous), which also
    answers when the Hub cannot be reached, saying so in ``resolution``.

    ``fresh=False`` hands a catalog entry out without the deep copy of its config, for
    callers that only read it (the fit calculator, on every request).
    """
    spec = spec.strip()
    if not spec:
        raise InputError("model", "empty model name", accepted="a Hugging Face id or a path")
    is_url = spec.lower().startswith(("https://huggingface.co/", "http://huggingface.co/"))
    path = expand_path(spec)
    if not is_url and path_exists(path):
        return _load_path(path)
    hub_source, why = _from_hub(spec, revision)
    if hub_source is not None:
        return _fresh(hub_source) if fresh else hub_source
    try:
        source = _from_catalog(spec, is_url, fresh)
    except InputError as exc:
        if why:  # not on the Hub as far as we could see, and not in the catalog
            raise InputError("model", f"{exc.message}; {why.split(':')[0]}") from None
        raise
    if why:
        source = dataclasses.replace(source, resolution=why) if fresh else _noted(source, why)
    return source


_NOTED: dict[tuple[str, str], ModelSource] = {}


def _noted(source: ModelSource, why: str) -> ModelSource:
    """The shared catalog entry with where it came from said (one object per entry and
    reason, so callers that only read keep sharing it)."""
    key = (source.hf_id, why)
    if key not in _NOTED:
        _NOTED[key] = dataclasses.replace(source, resolution=why)
    return _NOTED[key]


def _from_hub(spec: str, revision: str | None) -> tuple[ModelSource | None, str]:
    """The model from the Hub, or (None, why the catalog answers instead). A repository the
    Hub refuses is an error only when the catalog does not have the model either."""
    from . import hub

    repo_id = hub.repo_id_of(spec)
    if not hub.is_repo_id(repo_id) or not hub.enabled():
        return None, ""
    try:
        files = hub.fetch(repo_id, revision)
    except InputError as exc:
        if revision is None and _in_catalog(repo_id):
            return None, f"the catalog's copy of config.json is used ({exc.message})"
        raise
    if files is None:
        why = (
            "HF_HUB_OFFLINE is set and the Hub cache has no copy"
            if hub.HubSettings.from_env().offline
            else "the Hugging Face Hub could not be reached and its cache has no copy"
        )
        return None, f"{why}: the catalog's copy of config.json is used"
    key = (files.repo_id, files.revision, files.commit, files.from_cache_only, str(files.config))
    if key not in _HUB_SOURCES:  # read and normalised once per process, as catalog entries
        _HUB_SOURCES[key] = _hub_source(files)
    return _HUB_SOURCES[key], ""


_HUB_SOURCES: dict[tuple[Any, ...], ModelSource] = {}


def _in_catalog(repo_id: str) -> bool:
    by_id, _ = _model_index()
    return repo_id.lower() in by_id


def _hub_source(files: Any) -> ModelSource:
    config = _read_json(files.config)
    if not isinstance(config, dict):
        raise InputError("model", f"{files.repo_id}'s config.json is not a JSON object")
    quant = files.optional.get("hf_quant_config.json")
    hf_quant_config = _read_json(quant) if quant else None
    if not isinstance(hf_quant_config, dict):
        hf_quant_config = None
    config, quant_how = _with_modelopt_quantization(config, hf_quant_config)
    index = files.optional.get("model.safetensors.index.json")
    checkpoint_bytes = _index_total_size(index) if index else None
    resolution = ""
    if files.tensors is not None:
        checkpoint_bytes = files.tensors.total_bytes
        resolution = f"; checkpoint measured from its safetensors headers: {_counts(files.tensors)}"
    where = f"{files.repo_id}@{files.commit or files.revision}"
    how = "the local Hub cache" if files.from_cache_only else "the Hugging Face Hub"
    return ModelSource(
        hf_id=files.repo_id,
        config=config,
        source_url=files.source_url,
        checkpoint_bytes=checkpoint_bytes,
        origin="hub",
        notes=quant_how,
        hf_quant_config=hf_quant_config,
        revision=files.commit,
        resolution=f"config.json of {where} from {how}{resolution}",
        tensors=files.tensors,
    )


def _from_catalog(spec: str, is_url: bool, fresh: bool) -> ModelSource:
    by_id, by_name = _model_index()
    from .hub import repo_id_of

    key = repo_id_of(spec).lower().strip("/")
    if key in by_id:
        return _fresh(by_id[key]) if fresh else by_id[key]
    if "/" not in key and key in by_name:
        matches = by_name[key]
        if len(matches) == 1:
            return _fresh(matches[0]) if fresh else matches[0]
        raise InputError(
            "model",
            f"'{spec}' is ambiguous; use the full id: " + ", ".join(m.hf_id for m in matches),
        )
    if not is_url and _looks_like_path(spec):
        raise InputError("model", f"no such file or folder: {spec}")

    candidates = {k: m.hf_id for k, m in by_id.items()}
    for name, ms in by_name.items():
        for m in ms:
            candidates.setdefault(name, m.hf_id)
    close = difflib.get_close_matches(key, list(candidates), n=10, cutoff=0.4)
    suggestions: list[str] = []
    for k in close:
        if candidates[k] not in suggestions:
            suggestions.append(candidates[k])
    closest = ", ".join(suggestions[:3]) if suggestions else "none"
    raise InputError(
        "model",
        f"unknown model '{spec}'; closest: {closest}; "
        "or pass a path to a config.json / model folder",
    )
