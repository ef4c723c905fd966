"""paho's log, at the levels its lines mean to us.

paho logs a connection the broker dropped (reset, or silent past the keepalive) at
ERROR, through the logger aiomqtt hands it. It is no error of ours: the service logs
the loss itself, as a warning, and reconnects (or was stopping anyway). A broker that
dies under a worker would otherwise leave an ERROR line for every connection. paho's
other errors (an exception in a callback) keep their level.
"""

from __future__ import annotations

import logging

PAHO_LOG = logging.getLogger("mqtt")  # aiomqtt's own default: quieted by this name
_LOSS_FORMATS = frozenset({"failed to receive on socket: %s", "timeout on socket: %s"})


def _loss_is_a_warning(record: logging.LogRecord) -> bool:
    if record.levelno == logging.ERROR and record.msg in _LOSS_FORMATS:
        record.levelno, record.levelname = logging.WARNING, "WARNING"
    return True


PAHO_LOG.addFilter(_loss_is_a_warning)
