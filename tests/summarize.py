"""Print one closing line over the JUnit files of a test run.

Parallel tests run on every rank of each transport: a test counts once per transport
(``parallel-<transport>-rank<N>.xml``), and fails if it failed on any rank.
Usage: python tests/summarize.py RESULTS_DIR
"""
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(path: Path) -> dict[str, str]:
    result = {}
    # The transport of a parallel run keeps its tests apart from the other transport's.
    transport = path.stem.split("-rank")[0] + ":" if "-rank" in path.stem else ""
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{transport}{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            result[name] = "failed"
        elif case.find("skipped") is not None:
            result[name] = "skipped"
        else:
            result[name] = "passed"
    return result


def main(results: Path) -> int:
    merged: dict[str, str] = {}
    files = sorted(results.glob("*.xml"))
    for path in files:
        for name, outcome in outcomes(path).items():
            if merged.get(name) != "failed":
                merged[name] = outcome if outcome == "failed" or name not in merged else merged[name]
    counts = {k: sum(1 for v in merged.values() if v == k) for k in ("passed", "failed", "skipped")}
    runs = sorted({f.stem.split("-rank")[0] for f in files if "-rank" in f.stem})
    print(f"(from {len(files)} result files; parallel runs: {', '.join(runs) or 'none'})")
    print(f"tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    return 1 if counts["failed"] or not merged else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".test-results")))
