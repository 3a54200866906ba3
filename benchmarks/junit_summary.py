"""Summarise a pytest junit XML into JSON with provenance (the device scripts' GPU-test step):

    python3 benchmarks/junit_summary.py TESTS.xml ENV.json OUT.json "suite name"

Writes ``{provenance: <ENV.json>, suite, counts: {passed, failed, skipped, error}, failed: [class::name, ...]}``
and prints the counts. A missing or unreadable XML (the run was cut before pytest wrote it) prints that and exits 0.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET


def main(xml_path: str, env_path: str, out_path: str, suite: str) -> None:
    try:
        root = ET.parse(xml_path).getroot()
    except Exception as e:
        print(f"no junit xml ({e})")
        return
    res = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    failed = []
    for c in root.iter("testcase"):
        tag = next((ch.tag for ch in c if ch.tag in ("failure", "error", "skipped")), "passed")
        res[{"failure": "failed"}.get(tag, tag)] += 1
        if tag in ("failure", "error"):
            failed.append(f"{c.get('classname')}::{c.get('name')}")
    out = dict(provenance=json.load(open(env_path)), suite=suite, counts=res, failed=failed)
    json.dump(out, open(out_path, "w"), indent=1)
    print(f"{suite}:", res, ("failed: " + ", ".join(failed[:10])) if failed else "")


if __name__ == "__main__":
    main(*sys.argv[1:5])
