"""What the worker keeps per request, and for how long: the dedup store's records, early
cancels and tasks (part of the settings model: `settings.Settings` inherits them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from toolbus.wire.store_url import check


class RecordSettings(BaseSettings):
    """The dedup store and what it keeps: records, tombstones of early cancels, tasks,
    continuations and approvals."""

    dedup_store: str = Field(
        default="memory",
        description="Where request ids are deduplicated: `memory` (this worker), or shared by "
        "replicas (needs `toolbus[redis]`): `redis://host:port/db`, a Sentinel-watched "
        "primary `redis+sentinel://host:port[,host:port]/service`, or a Redis Cluster "
        "`redis+cluster://host:port[,host:port]`.",
    )
    dedup_ttl_s: float = Field(
        default=600.0, gt=0, description="How long a request id's reply is kept for repeats."
    )
    dedup_max_records: int = Field(
        default=10_000,
        ge=1,
        description="The memory store's bound on finished calls: beyond it the oldest of the "
        "caller holding the most is forgotten (its repeat runs again).",
    )
    dedup_max_reply_bytes: int = Field(
        default=64 << 10,
        ge=1024,
        description="The largest reply a dedup record keeps whole; a larger one is kept as a "
        "summary, and its repeats get `reply_not_kept` (never a second run).",
    )
    dedup_caller_max_bytes: int = Field(
        default=16 << 20,
        ge=64 << 10,
        description="The bytes one caller's dedup records may hold (memory store: this "
        "worker; Redis: the fleet); beyond it its oldest replies give way to summaries.",
    )
    dedup_max_bytes: int = Field(
        default=64 << 20,
        ge=64 << 10,
        description="The bytes all dedup records may hold; beyond it the oldest replies of "
        "the caller holding the most give way to summaries.",
    )
    dedup_unavailable: Literal["refuse", "run"] = Field(
        default="refuse",
        description="What a call gets while the dedup store is unreachable: `refuse` answers "
        "`unavailable` (nothing runs twice); `run` runs it unrecorded (available, but a "
        "repeat of it may run again; counted in toolbus.dedup.unrecorded_runs).",
    )
    cancel_remember_s: float = Field(
        default=60.0,
        gt=0,
        description="How long a cancel that came before its call is remembered (in the "
        "dedup store): the call, if it comes within that time, is answered `cancelled` "
        "without running.",
    )
    task_ttl_s: float = Field(
        default=3600.0, gt=0, description="How long a task's record and result are kept."
    )
    task_caller_max_bytes: int = Field(
        default=4 << 20, ge=64 << 10, description="The bytes one caller's task records hold."
    )

    input_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="How long a call's question (`input_required`) waits for its caller's "
        "continuation; past it the tool's server is answered as if the caller declined.",
    )
    input_max_open: int = Field(
        default=8,
        ge=1,
        description="How many of one caller's calls may wait for its answers at once on a "
        "worker while their server holds them open (servers before 2026-07-28 keep the "
        "call, and its `max_in_flight` slot, while they ask); beyond it, the next question "
        "fails for the caller (a JSON-RPC error to the server, never a `decline`).",
    )
    approval_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="How long an `approval_required` token can approve its call.",
    )
    token_caller_max_bytes: int = Field(
        default=1 << 20,
        ge=64 << 10,
        description="The bytes one caller's open continuations and approvals may hold (the "
        "questions and calls they keep); beyond it its next one is `rate_limited`.",
    )

    @field_validator("dedup_store")
    @classmethod
    def _store_url(cls, value: str) -> str:
        if value == "memory":
            return value
        return check(value)
