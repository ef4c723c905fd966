"""A request/reply client over MQTT v5: used by `toolbus call`, `toolbus tools` and the tests."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from toolbus.config import BrokerUrl
from toolbus.contracts import Reply
from toolbus.messages import Outbound
from toolbus.transport import MqttConnection


class NoReply(Exception):
    """No reply arrived within the deadline."""


async def request(
    broker: BrokerUrl,
    topic: str,
    body: dict[str, Any],
    *,
    reply_prefix: str,
    timeout_s: float,
) -> Reply:
    """Publish one request with a private reply topic and wait for its reply."""
    client_id = f"toolbus-cli-{uuid.uuid4().hex[:12]}"
    reply_topic = f"{reply_prefix}{client_id}"
    correlation = uuid.uuid4().hex.encode()
    async with MqttConnection(broker, client_id=client_id, timeout_s=timeout_s) as conn:
        await conn.subscribe([reply_topic])
        await conn.publish(
            Outbound(
                topic=topic,
                payload=json.dumps(body).encode(),
                response_topic=reply_topic,
                correlation_data=correlation,
            )
        )
        try:
            async with asyncio.timeout(timeout_s):
                async for message in conn.messages():
                    if message.correlation_data == correlation:
                        return Reply.model_validate_json(message.payload)
        except TimeoutError:
            raise NoReply(f"no reply on {reply_topic} within {timeout_s:g} s") from None
    raise NoReply("the broker connection closed before a reply arrived")
