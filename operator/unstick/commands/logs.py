"""`--log-format json|text` and `--log-level` of the two long-running commands.

text: one line per record, `time LEVEL logger: message` (as before). json: one JSON object
per line with `message`, `timestamp`, `severity` (debug, info, warn, error, fatal) and the
record's extra fields — for the controller Kopf's own JSON format (`kopf.configure`, with
the object a handler works on under `object`), for the agent python-json-logger's formatter
with the same keys plus `logger` (the agent does not load Kopf).

Not a command (not in `unstick.cli.COMMANDS`): a helper of the modules that are.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_log_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text: one line per record (default); json: one JSON object per line",
    )
    p.add_argument("--log-level", choices=LEVELS, default="INFO", help="(default: INFO)")


def severity(levelno: int) -> str:
    """Kopf's words for a level, so both components' JSON logs read alike."""
    for limit, word in ((logging.DEBUG, "debug"), (logging.INFO, "info"),
                        (logging.WARNING, "warn"), (logging.ERROR, "error")):  # fmt: skip
        if levelno <= limit:
            return word
    return "fatal"


def agent_json_formatter() -> logging.Formatter:
    from pythonjsonlogger.json import JsonFormatter

    class Formatter(JsonFormatter):
        def add_fields(
            self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: Any
        ) -> None:
            super().add_fields(log_record, record, message_dict)
            log_record["severity"] = severity(record.levelno)

    return Formatter("%(message)s %(name)s", rename_fields={"name": "logger"}, timestamp=True)


def setup(log_format: str, level: str, *, kopf_json: bool = False) -> None:
    """The root logger: one stream handler on stderr in `log_format` at `level`. With
    `kopf_json` (the controller) the JSON is Kopf's own."""
    if log_format == "json" and kopf_json:
        import kopf

        kopf.configure(verbose=level == "DEBUG", log_format=kopf.LogFormat.JSON)
        logging.getLogger().setLevel(level)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        agent_json_formatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    logging.basicConfig(level=level, handlers=[handler])  # as before: not over a caller's
