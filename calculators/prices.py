"""GPU prices: the shipped on-demand table (``data/prices.toml``) and the user's overrides.

Every shipped row names its provider, offer, source URL and the date the figure
was read, because cloud prices move every few months and a recommendation is
only as current as its prices. A user's price (``--gpu-price GPU=USD`` or the
workload's ``constraints.gpu_prices_usd_per_hour``) always wins and is labelled
"user". Prices are USD per GPU-hour, on demand, before discounts.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .catalog import get_gpu
from .errors import InputError


@dataclass(frozen=True)
class PriceRow:
    gpu: str
    usd_per_gpu_hour: float
    provider: str
    offer: str
    source_url: str
    as_of: str
    default: bool

    @property
    def source(self) -> str:
        return f"{self.provider} {self.offer}, {self.source_url} (as of {self.as_of})"


@dataclass(frozen=True)
class Price:
    gpu: str
    usd_per_gpu_hour: float
    source: str


@lru_cache(maxsize=1)
def price_table() -> dict[str, list[PriceRow]]:
    """The shipped rows per GPU id, the default row first."""
    raw = resources.files("inferwise.calculators").joinpath("data/prices.toml").read_text()
    rows: dict[str, list[PriceRow]] = {}
    for item in tomllib.loads(raw)["price"]:
        row = PriceRow(
            gpu=get_gpu(item["gpu"]).id,
            usd_per_gpu_hour=float(item["usd_per_gpu_hour"]),
            provider=item["provider"],
            offer=item["offer"],
            source_url=item["source_url"],
            as_of=item["as_of"],
            default=bool(item.get("default", False)),
        )
        rows.setdefault(row.gpu, []).append(row)
    for gpu_rows in rows.values():
        gpu_rows.sort(key=lambda r: not r.default)
    return rows


def priced_gpus() -> list[str]:
    """GPU ids with a shipped price: the search's GPU set when the user names none."""
    return list(price_table())


def resolve_overrides(overrides: dict[str, float], field: str) -> dict[str, float]:
    """User prices keyed by catalog id (aliases such as ``h100`` resolve)."""
    out: dict[str, float] = {}
    for name, usd in overrides.items():
        try:
            gpu_id = get_gpu(name).id
        except InputError:
            raise InputError(
                field, f"unknown GPU '{name}' in a price", accepted="GPU catalog ids"
            ) from None
        out[gpu_id] = usd
    return out


def price_for(gpu_id: str, overrides: dict[str, float]) -> Price | None:
    """The price the search uses for ``gpu_id``: the user's, else the shipped default row."""
    if gpu_id in overrides:
        return Price(gpu_id, overrides[gpu_id], "user (--gpu-price / gpu_prices_usd_per_hour)")
    rows = price_table().get(gpu_id)
    if not rows:
        return None
    return Price(gpu_id, rows[0].usd_per_gpu_hour, rows[0].source)
