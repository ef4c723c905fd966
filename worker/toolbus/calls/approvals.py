"""Approvals: the calls a person must approve first, and the tokens that approve them.

`[callers.NAME] approve = ["destructive", "<tool>", ...]` gates a caller's calls. A tool
named there (by any name the registry resolves, as `tools` is read) is gated whatever it
says of itself (`reason: tool`). `destructive` gates every MCP tool that may change
something: its annotations say `destructiveHint` (true unless said otherwise, and unless
`readOnlyHint` is true), or it has none, or its server is not `trusted` (an untrusted
server's annotations are hints only, the MCP spec says: a server that lies about a
delete being read-only must not pass the gate). Local tools are the operator's own code,
configured into this worker on purpose, and carry no annotations: `destructive` does not
reach them, naming one does.

A gated call without an approval is answered `approval_required`: nothing runs, and a
token is kept (tokens.py) that binds the caller (`holder_of`), the tool and the exact
arguments it would run with (their fingerprint), for `approval_timeout_s`. The same call
again with `approval: <token>` runs once: the token is taken by that request (its dedup
key: a copy of it takes it again, and is then answered as a repeat). Any other use is
`approval_invalid`, `details.reason`: `used`, `mismatch` (other tool or arguments),
`expired`, `unknown` (no such token of this caller's). A caller's open approvals are
bounded by bytes (`token_caller_max_bytes`): beyond it `rate_limited`, `limit:
token_bytes`. An approval on a call no gate holds is not needed, and not looked at.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from toolbus.calls.call import Call
from toolbus.calls.preparation import Prepared
from toolbus.config.callers import (
    ANONYMOUS_CALLER,
    DEFAULT_CALLER_PROFILE,
    CallerProfile,
    caller_profile,
)
from toolbus.dedup import Once, fingerprint
from toolbus.dedup.tokens import (
    TokenBoundExceeded,
    TokenRecord,
    TokenStore,
    holder_of,
    new_token,
)
from toolbus.tools.registry import Registry, Tool
from toolbus.wire.errors import (
    ApprovalInvalid,
    ApprovalRequired,
    RateLimited,
    ToolbusError,
    Unavailable,
    UnknownTool,
)

log = logging.getLogger("toolbus.approvals")

DESTRUCTIVE = "destructive"
Reason = Literal["destructive", "tool"]


def destructive(tool: Tool, trusted: bool) -> bool:
    """May this MCP tool change something, as far as `destructive` goes (see above)?"""
    hints = tool.annotations
    if not hints or not trusted:
        return True
    if hints.get("readOnlyHint") is True:
        return False
    return hints.get("destructiveHint") is not False  # MCP's default: true


class Approvals:
    """Which calls each caller must have approved, and the gate that holds them.

    Args:
        profiles: `[callers.NAME]`, whose `approve` lists gate (`*` lends its list).
        trusted: the MCP servers whose annotations are believed (`trusted = true`).
        timeout_s: how long an approval is valid (`approval_timeout_s`).
    """

    def __init__(
        self,
        profiles: Mapping[str, CallerProfile],
        *,
        trusted: Iterable[str] = (),
        timeout_s: float = 300.0,
    ) -> None:
        self._profiles = dict(profiles)
        self._trusted = frozenset(trusted)
        self.timeout_s = timeout_s
        self._named: dict[str, frozenset[str]] = {}  # caller -> qualified names it gates
        self._destructive: set[str] = set()  # callers whose list says `destructive`
        self._any = any(profile.approve for profile in self._profiles.values())

    @property
    def any(self) -> bool:
        """Does any profile gate anything? (None does: no call pays for a look.)"""
        return self._any

    def refresh(self, registry: Registry) -> None:
        """Each profile's gated names as qualified names (the registry changed)."""
        named: dict[str, frozenset[str]] = {}
        self._destructive = set()
        for caller in self._profiles:
            names: set[str] = set()
            for entry in caller_profile(self._profiles, caller).approve or ():
                if entry == DESTRUCTIVE:
                    self._destructive.add(caller)
                    continue
                try:
                    names.add(registry.resolve(entry).tool.qualified_name)
                except UnknownTool:
                    continue  # a tool not (yet) there gates nothing; `tools` reports names
            named[caller] = frozenset(names)
        self._named = named

    def reason(self, caller: str | None, tool: Tool) -> Reason | None:
        """Why `caller`'s call of `tool` waits for an approval (None: it does not)."""
        name = caller or ANONYMOUS_CALLER
        profile = name if name in self._profiles else DEFAULT_CALLER_PROFILE
        if tool.qualified_name in self._named.get(profile, ()):
            return "tool"
        if profile in self._destructive and tool.server is not None:
            return "destructive" if destructive(tool, tool.server in self._trusted) else None
        return None

    async def gate(self, call: Call, prepared: Prepared, tokens: TokenStore) -> ToolbusError | None:
        """What a gated call gets instead of running (None: it runs). Asked once access,
        normalization and validation have passed: the call is exactly what would run."""
        asked = prepared.asked()
        if asked is None or prepared.tool is None or prepared.expired:
            return None  # refused already, or too late to run: nothing to approve
        reason = self.reason(call.caller, prepared.tool)
        if reason is None:
            return None
        tool, arguments = asked
        holder = holder_of(call.caller, call.reply_topic)
        binding = fingerprint(tool, arguments)
        try:
            if call.approval is not None:
                return await self._approved(call, holder, binding, tokens)
            shown = {"tool": tool, "arguments": arguments}
            return await self._required(holder, binding, shown, reason, tokens)
        except Exception as exc:  # the store is unreachable: say so, run nothing
            log.warning("token store failed for %s: %s", call.id, exc)
            return Unavailable("the token store is unreachable", store=True)

    async def _approved(
        self, call: Call, holder: str, binding: str, tokens: TokenStore
    ) -> ToolbusError | None:
        """Taken for this request (a copy of it, by its dedup key, takes it again)."""
        assert call.approval is not None
        taker = Once.key(call.caller, call.reply_topic, call.id) or f"{holder}\x1f{call.id}"
        taken = await tokens.take(call.approval, holder, taker, binding)
        if taken.record is not None and taken.record.kind == "approval":
            return None
        reason = taken.refused or "mismatch"  # another kind of token approves nothing
        return ApprovalInvalid(f"the approval cannot approve this call: {reason}", reason=reason)

    async def _required(
        self,
        holder: str,
        binding: str,
        shown: dict[str, Any],
        reason: Reason,
        tokens: TokenStore,
    ) -> ToolbusError:
        """A new approval to ask a person for, and the call it would approve (`shown`)."""
        token = new_token("approval")
        record = TokenRecord(
            token=token,
            kind="approval",
            holder=holder,
            owner=tokens.owner,
            body=json.dumps(shown, separators=(",", ":"), default=str),
            expires_at=time.time() + self.timeout_s,
            binding=binding,
        )
        try:
            await tokens.put(record, self.timeout_s)
        except TokenBoundExceeded:
            return RateLimited("the caller's open approvals fill its bound", limit="token_bytes")
        return ApprovalRequired(
            f"{shown['tool']} waits for a person's approval ({reason}); nothing ran",
            approval=token,
            call=shown,
            reason=reason,
            expires_in_s=self.timeout_s,
        )
