"""A demo MCP server modelled on a home-automation (Z-Wave) bridge, over stdio.

Its parameters are camelCase (`deviceName`, `action`, `level`) on purpose: AI
clients tend to send `device_name`, and toolbus's normalization bridges the two.
Device state lives in memory; logs go to stderr only, since stdout is the protocol.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import asdict, dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

log = logging.getLogger("toolbus.demo")


@dataclass
class Device:
    name: str
    kind: Literal["switch", "dimmer", "sensor"]
    state: Literal["on", "off"] = "off"
    level: int = 0
    temperature_c: float | None = None
    humidity_pct: float | None = None


def initial_devices() -> dict[str, Device]:
    devices = [
        Device("Switch One", "switch"),
        Device("Switch Two", "switch"),
        Device("Living Room Lamp", "dimmer"),
        Device("Hallway Sensor", "sensor", state="on", temperature_c=21.5, humidity_pct=44.0),
    ]
    return {d.name.casefold(): d for d in devices}


def build_server() -> Any:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError  # its text reaches the client

    devices = initial_devices()
    server = MCPServer("toolbus-demo-devices", instructions="A demo Z-Wave device bridge.")

    def find(name: str) -> Device:
        device = devices.get(name.casefold())
        if device is None:
            known = ", ".join(d.name for d in devices.values())
            raise ToolError(f"Unknown device '{name}'. Known devices: {known}")
        return device

    @server.tool()
    def control_zwave_device(
        deviceName: Annotated[str, Field(description="Name of the device, e.g. 'Switch One'")],  # noqa: N803 -- camelCase is the schema's name
        action: Annotated[Literal["on", "off", "dim"], Field(description="What to do")],
        level: Annotated[int | None, Field(ge=0, le=100, description="Brightness for dim")] = None,
    ) -> dict[str, Any]:
        """Turn a Z-Wave device on or off, or dim it to a level (0-100)."""
        received: dict[str, Any] = {"deviceName": deviceName, "action": action}
        if level is not None:
            received["level"] = level
        # Names, not values: a worker relays this server's stderr into its own log, where
        # argument values stay out unless `log_arguments` says otherwise.
        log.info("control_zwave_device received %s", ", ".join(received))
        device = find(deviceName)
        if device.kind == "sensor":
            raise ToolError(f"'{device.name}' is a sensor and cannot be controlled")
        if action == "dim":
            if device.kind != "dimmer":
                raise ToolError(f"'{device.name}' is a {device.kind} and cannot be dimmed")
            if level is None:
                raise ToolError("action 'dim' needs a level between 0 and 100")
            device.state, device.level = ("on" if level > 0 else "off"), level
        else:
            device.state = action
            device.level = 100 if action == "on" else 0
        return {"received": received, "device": asdict(device)}

    @server.tool()
    def get_device_sensor_data(
        deviceName: Annotated[str, Field(description="Name of the device")],  # noqa: N803 -- camelCase is the schema's name
    ) -> dict[str, Any]:
        """Current state and readings of a device."""
        return asdict(find(deviceName))

    @server.tool()
    def list_devices() -> dict[str, Any]:
        """All known devices with their kind and state."""
        return {"devices": [asdict(d) for d in devices.values()]}

    return server


def main(http: str | None = None) -> None:
    """Serve on stdio, or on streamable HTTP at `host:port` (path `/mcp`) when `http` is given."""
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    server = build_server()
    if http is None:
        server.run("stdio")
        return
    host, _, port = http.rpartition(":")
    server.run("streamable-http", host=host or "127.0.0.1", port=int(port))
