"""The names other packages import from `worker` (tool authors use these)."""

import worker


def test_exported_names() -> None:
    assert sorted(worker.__all__) == [
        "ErrorCode",
        "LocalTool",
        "Reply",
        "Request",
        "ToolbusError",
        "__version__",
        "tool",
    ]
    assert worker.__version__ != "0.0.0"  # installed, so the version comes from the metadata
