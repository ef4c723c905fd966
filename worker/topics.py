"""Topic templates and reply-topic rules, in one place.

{prefix}/call              request; tool named in the body
{prefix}/call/{tool}       request; tool named by the topic
{prefix}/call/{caller}/{tool}   request from a named caller (when no tool has that name)
{prefix}/tools             list tool definitions (answered like a call)
{prefix}/tools/{caller}    list the tool definitions that caller may use
{prefix}/dead              dead letters: requests that could not be answered
{prefix}/status/workers/{worker_id}   retained worker status, last will `offline`
{prefix}/status/servers/{name}        retained state of one MCP server
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_TOPIC_BYTES = 1024


@dataclass(frozen=True, slots=True)
class Topics:
    prefix: str
    shared_group: str
    reply_prefixes: tuple[str, ...]

    @property
    def call(self) -> str:
        return f"{self.prefix}/call"

    @property
    def tools(self) -> str:
        return f"{self.prefix}/tools"

    @property
    def dead(self) -> str:
        return f"{self.prefix}/dead"

    def status(self, worker_id: str) -> str:
        return f"{self.prefix}/status/workers/{worker_id}"

    def server_status(self, server: str) -> str:
        return f"{self.prefix}/status/servers/{server}"

    def subscriptions(self) -> tuple[str, ...]:
        # `call/#` also matches `call` itself (MQTT 3.1.1 §4.7.1.2).
        filters = (f"{self.call}/#", f"{self.tools}/#")
        if not self.shared_group:
            return filters
        return tuple(f"$share/{self.shared_group}/{f}" for f in filters)

    def tool_from_topic(self, topic: str) -> str | None:
        """The tool a topic names, `""` for the bare call topic, None if not a call topic."""
        if topic == self.call:
            return ""
        head = self.call + "/"
        if topic.startswith(head):
            return topic[len(head) :]
        return None

    def is_tools_request(self, topic: str) -> bool:
        return topic == self.tools or topic.startswith(self.tools + "/")

    def caller_from_tools_topic(self, topic: str) -> str | None:
        if topic == self.tools:
            return None
        return topic[len(self.tools) + 1 :] or None

    def reply_allowed(self, topic: str) -> bool:
        """May a reply go here? Refuses wildcards, `$` topics and foreign prefixes."""
        if not topic or len(topic.encode()) > MAX_TOPIC_BYTES:
            return False
        if "+" in topic or "#" in topic or "\x00" in topic or topic.startswith("$"):
            return False
        # Whatever the prefixes allow, a reply must never become a request.
        if self.tool_from_topic(topic) is not None or self.is_tools_request(topic):
            return False
        return any(topic.startswith(prefix) for prefix in self.reply_prefixes)
