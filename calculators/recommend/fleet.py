"""A sized fleet in money and GPU-hours: cost per token and per successful request,
cold starts, and a day of autoscaling replayed against the traffic profile.

A fixed fleet pays for its peak capacity all day, so per-token and per-request
costs divide the fleet's hourly cost by the work of an *average* hour. A
request is successful when it met every target in the simulation at the
design load (the peak): a conservative share, since most hours run below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .result import AutoscalingReplay, ColdStart
from .spec import SearchSpec

IMAGE_PULL_S = 300.0
"""Pulling and unpacking the vllm/vllm-openai image (~12 GB compressed, vllm#27154) on a node
without it: other large images pull at 17-42 MB/s (10 GB in 7-10 min, tensorfuse.io
snapshotter blog; 13 GB in 571 s, blog.vertexcover.io/container-coldstart). A pre-pulled
image or a warm node pool is ~0; set cold_start_s when you know yours."""
STORAGE_GB_PER_S = 0.5
"""Checkpoint read bandwidth, vendor GB (10^9 bytes) per second, for a new node reading from a
network volume or object store: EBS gp3 gives 0.13-1 GB/s, S3 through Run:ai's streamer
~3.5 GiB/s at best and 0.4-0.8 GiB/s in users' reports (run-ai/runai-model-streamer
benchmarks.md, issues #13/#120). Local NVMe with vLLM's default loader: 1.6-1.85 GB/s
(vllm#10647)."""
ENGINE_START_S = 63.0
"""vLLM V1 start after the weights are read: process start 15 s, torch.compile 33 s (median of
12 start-up logs, 19-85 s; ~9 s from a warm compile cache), CUDA-graph capture 10 s (median of
10, 1.5-60 s), profiling and KV-cache set-up 5 s; sources in tests/data/cold_start_sources.md
(vLLM issues and PRs, upb-cn/vllm-startup-profiler)."""
STEP_S = 60.0
"""The replay's time step: the scaling rule looks at the arrival rate once a minute."""
SCALE_DOWN_AFTER_S = 600.0
"""A replica is released after ten minutes below what the rule needs (the usual cool-down)."""


@dataclass(frozen=True)
class Costs:
    usd_per_hour: float
    usd_per_million_output_tokens: float
    usd_per_million_input_tokens: float
    usd_per_successful_request: float
    gpu_hours_per_day: float
    usd_per_day: float


def fixed_fleet_costs(
    total_gpus: int, usd_per_gpu_hour: float, spec: SearchSpec, attainment: float
) -> Costs:
    """Costs of a fleet that runs all day at its peak size."""
    usd_per_hour = total_gpus * usd_per_gpu_hour
    per_hour = spec.daily_mean_rate_per_s * 3600.0
    out_m = per_hour * spec.output_tokens.mean / 1e6
    in_m = per_hour * spec.input_tokens.mean / 1e6
    ok = per_hour * attainment
    return Costs(
        usd_per_hour=usd_per_hour,
        usd_per_million_output_tokens=usd_per_hour / out_m if out_m else math.inf,
        usd_per_million_input_tokens=usd_per_hour / in_m if in_m else math.inf,
        usd_per_successful_request=usd_per_hour / ok if ok else math.inf,
        gpu_hours_per_day=total_gpus * 24.0,
        usd_per_day=usd_per_hour * 24.0,
    )


def cold_start(checkpoint_bytes: int, stated_s: float | None) -> ColdStart:
    """Seconds until a new replica serves: image pull + weight load + engine start."""
    if stated_s is not None:
        return ColdStart(
            image_pull_s=0.0,
            weight_load_s=0.0,
            engine_start_s=0.0,
            total_s=stated_s,
            source="stated (cold_start_s)",
        )
    load = checkpoint_bytes / (STORAGE_GB_PER_S * 1e9)
    return ColdStart(
        image_pull_s=IMAGE_PULL_S,
        weight_load_s=load,
        engine_start_s=ENGINE_START_S,
        total_s=IMAGE_PULL_S + load + ENGINE_START_S,
        source=(
            f"image pull {IMAGE_PULL_S:g} s (a ~12 GB image on a node without it) + checkpoint "
            f"{checkpoint_bytes / 1e9:,.1f} GB at {STORAGE_GB_PER_S:g} GB/s (network storage) + "
            f"engine start {ENGINE_START_S:g} s (compile, CUDA graphs, profiling: medians of "
            "published vLLM V1 start-up logs); give cold_start_s to use your own"
        ),
    )


@dataclass
class _Fleet:
    """The replay's state: replicas serving, and when each starting one will be ready."""

    ready: int
    starting: list[float]
    below_since: float | None = None


def _wanted(rate: float, spec: SearchSpec, max_rate: float, spares: int, cap: int) -> int:
    """Replicas the rule asks for at ``rate``: the hour's rate x peak_to_mean (the burst the
    rule cannot react to within the hour) over one replica's rate, plus the spares."""
    floor = 0 if spec.autoscaling.scale_to_zero else max(1, spec.autoscaling.min_replicas or 1)
    if rate <= 0:
        return min(cap, floor)
    serving = math.ceil(rate * spec.peak_to_mean / max_rate - 1e-9)
    return min(cap, max(floor, serving + spares))


def replay_day(
    spec: SearchSpec,
    max_rate_per_replica: float,
    spares: int,
    fixed_replicas: int,
    gpus_per_replica: int,
    usd_per_gpu_hour: float,
    start: ColdStart,
) -> AutoscalingReplay:
    """Minute steps over the 24-hour profile (the mean rate every hour when none is given)."""
    hourly = spec.hourly_rate_per_s or [spec.mean_rate_per_s] * 24
    fleet = _Fleet(
        ready=_wanted(hourly[0], spec, max_rate_per_replica, spares, fixed_replicas), starting=[]
    )
    replica_s = missed = arrived = 0.0
    for step in range(int(24 * 3600 / STEP_S)):
        t = step * STEP_S
        rate = hourly[int(t // 3600) % 24]
        fleet.ready += sum(1 for r in fleet.starting if r <= t)
        fleet.starting = [r for r in fleet.starting if r > t]
        want = _wanted(rate, spec, max_rate_per_replica, spares, fixed_replicas)
        _scale(fleet, want, t, start.total_s)
        replica_s += (fleet.ready + len(fleet.starting)) * STEP_S
        serving = max(0, fleet.ready - (spares if fleet.ready > spares else 0))
        demand = rate * STEP_S
        arrived += demand
        capacity = (serving if serving else fleet.ready) * max_rate_per_replica * STEP_S
        missed += max(0.0, demand - capacity)
    gpu_h = replica_s / 3600.0 * gpus_per_replica
    fixed_h = fixed_replicas * gpus_per_replica * 24.0
    ttft_target_s = max(spec.slo_ttft_ms.values(), default=math.inf) / 1e3
    idle_hours = spec.autoscaling.scale_to_zero and min(hourly) <= 0
    return AutoscalingReplay(
        rule=(
            "every minute: replicas = ceil(hour's rate x peak_to_mean / max rate per replica) + "
            f"spares, between {0 if spec.autoscaling.scale_to_zero else max(1, spec.autoscaling.min_replicas or 1)} "
            f"and the fixed fleet ({fixed_replicas}); a new replica serves after the cold start; "
            f"one is released after {SCALE_DOWN_AFTER_S / 60:g} minutes unneeded"
        ),
        cold_start=start,
        gpu_hours_per_day=gpu_h,
        fixed_fleet_gpu_hours_per_day=fixed_h,
        gpu_hours_saved_per_day=fixed_h - gpu_h,
        usd_per_day=gpu_h * usd_per_gpu_hour,
        fixed_fleet_usd_per_day=fixed_h * usd_per_gpu_hour,
        requests_missing_slo_during_scale_up=missed / arrived if arrived else 0.0,
        first_requests_after_idle_miss_ttft=bool(idle_hours and start.total_s > ttft_target_s),
        notes=_replay_notes(spec, start, idle_hours, ttft_target_s),
    )


def _scale(fleet: _Fleet, want: int, t: float, cold_start_s: float) -> None:
    have = fleet.ready + len(fleet.starting)
    if want > have:
        fleet.starting += [t + cold_start_s] * (want - have)
        fleet.below_since = None
    elif want < fleet.ready:
        if fleet.below_since is None:
            fleet.below_since = t
        elif t - fleet.below_since >= SCALE_DOWN_AFTER_S:
            fleet.ready = want
            fleet.below_since = None
    else:
        fleet.below_since = None


def _replay_notes(spec: SearchSpec, start: ColdStart, idle: bool, ttft_s: float) -> list[str]:
    notes = [f"cold start {start.total_s:,.0f} s: {start.source}"]
    if not spec.hourly_rate_per_s:
        notes.append("no 24-hour profile (traffic.hourly_rate_rps): every hour at the mean rate")
    if idle and start.total_s > ttft_s:
        notes.append(
            f"scale to zero: the first requests after an idle hour wait ~{start.total_s:,.0f} s "
            f"for a replica, above the TTFT target ({ttft_s * 1e3:,.0f} ms); keep min_replicas >= 1 "
            "or accept those misses"
        )
    return notes
