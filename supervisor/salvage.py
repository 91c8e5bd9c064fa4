"""What the runner writes when the collector died and the run could not go on: detections.json and
predictions.json made valid from the collector's partial files (every whole record it wrote), and
a report.json of what the runner knows (why it stopped, the restarts, the frames the collector
last counted), so the run folder is whole and results/latest can point at it.

The collector writes those lists one record per line after a "[" line (analysis.atomic.JsonListFile);
the record it was writing when it died may be cut: it and anything after it are left out.
"""

from __future__ import annotations

import json
import logging
import os

from analysis.atomic import PARTIAL_LIST, whole_records, write_bytes_atomic

log = logging.getLogger("runner")

def salvage_lists(run_dir: str) -> dict[str, int]:
    """{file name: records} of every list file made valid from a dead writer's partial file."""
    salvaged = {}
    for entry in os.scandir(run_dir):
        match = PARTIAL_LIST.match(entry.name)
        if not match or os.path.exists(os.path.join(run_dir, match.group(1))):
            continue
        try:
            with open(entry.path, encoding="utf-8", errors="surrogateescape") as partial:
                records = whole_records(partial.read())
            write_bytes_atomic(os.path.join(run_dir, match.group(1)), json.dumps(records, indent=1).encode())
            os.unlink(entry.path)
        except OSError as exc:
            log.error("could not make %s valid from %s: %s", match.group(1), entry.name, exc)
            continue
        salvaged[match.group(1)] = len(records)
    return salvaged


def write_runner_report(run_dir: str, *, reason: str, config: dict, progress: dict | None, restarts: list,
                        dropped: dict, salvaged: dict[str, int]) -> bool:
    """report.json of what the runner knows, marked ``"complete": false``; True once written."""
    report = {"complete": False, "written_by": "runner",
              "reason": f"{reason}: the collector is gone, so this report holds only what the runner knows",
              "config": config,
              "frames": {"processed": (progress or {}).get("processed"), "failed": (progress or {}).get("failed"),
                         "accounted": False},
              "restarts": restarts, "dropped_messages": {"runner": dropped} if dropped else {},
              "files_salvaged": salvaged}
    try:
        write_bytes_atomic(os.path.join(run_dir, "report.json"), json.dumps(report, indent=1).encode())
    except (OSError, TypeError, ValueError) as exc:
        log.error("could not write the runner's report.json: %s", exc)
        return False
    return True
