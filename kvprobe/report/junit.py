"""The verdict as JUnit XML, for CI systems that show test reports (GitHub, GitLab, Jenkins).

One <testsuite> per candidate; one <testcase> for its server health, one for the one-knob check, one for
the capacity gain and one per check, named by its metric and case. Anything but a pass is a <failure>
whose message is the verdict's own words: `inconclusive` and `not_measured` fail too, never skip, since
a gate that passes because nothing ran is the classic way a CI gate lies. Built only from the verdict,
so the bytes are as deterministic as the verdict's, and no secret is in it.
"""

from __future__ import annotations

from typing import Any
from xml.etree import ElementTree as ET

from kvprobe.report import cells
from kvprobe.report.tables import knob_of


def _case(suite: ET.Element, classname: str, name: str, failure: tuple[str, str] | None) -> None:
    case = ET.SubElement(suite, "testcase", {"classname": classname, "name": name})
    if failure is not None:
        kind, message = failure
        node = ET.SubElement(case, "failure", {"type": kind, "message": message})
        node.text = message


def _candidate_cases(v: dict[str, Any], name: str) -> list[tuple[str, tuple[str, str] | None]]:
    d = v["decisions"][name]
    decision, reasons = d.get("decision"), d.get("reasons") or ["no reason recorded"]
    status = (v["servers"].get(name) or {}).get("status")
    cases: list[tuple[str, tuple[str, str] | None]] = []
    health = None if decision != "broken" and status in (None, "ok") else ("broken", reasons[0])
    cases.append(("server health", health))
    cases.append(("one-knob check", ("invalid", "; ".join(reasons)) if decision == "invalid" else None))
    if decision in ("invalid", "broken") and not d.get("checks"):
        return cases  # nothing was measured: the two failures above say why
    ratio = d.get("capacity_ratio")
    if decision == "no_gain":
        capacity = ("no_gain", reasons[0])
    elif ratio is None:
        capacity = ("not_measured", "capacity unknown (no kv_cache_tokens)")
    else:
        capacity = None
    cases.append(("capacity_gain_min", capacity))
    for check in d.get("checks") or []:
        # named by what it measures ("TTFT p99 rise at shape=default agents=4"): one bar covers TTFT,
        # ITL and E2E in every load case, so the bar's name alone would repeat
        ok = not cells.holds_back(check)  # a guardrail that did not fail never gates: not a failure
        cases.append((cells.label(check), None if ok else (check["outcome"], check["text"])))
    return cases


def no_verdict_xml(why: str) -> bytes:
    """A run that ended before its verdict (a server out of reach, bad input): one failing case, so a
    CI test report never shows green for a run that measured nothing."""
    return _document([("kvprobe", {}, [("run", ("no_verdict", why))])])


def _document(suites: list[tuple[str, dict[str, Any], list[tuple[str, tuple[str, str] | None]]]]) -> bytes:
    root = ET.Element("testsuites", {"name": "kvprobe"})
    total = failed = 0
    for name, properties, cases in suites:
        failures = sum(1 for _, f in cases if f is not None)
        suite = ET.SubElement(root, "testsuite", {
            "name": name, "tests": str(len(cases)), "failures": str(failures), "errors": "0", "skipped": "0"})
        if properties:
            props = ET.SubElement(suite, "properties")
            for key, value in properties.items():
                ET.SubElement(props, "property", {"name": key, "value": "" if value is None else str(value)})
        for label, failure in cases:
            _case(suite, name, label, failure)
        total, failed = total + len(cases), failed + failures
    root.set("tests", str(total))
    root.set("failures", str(failed))
    root.set("errors", "0")
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def junit_xml(v: dict[str, Any], notes: list[str] | None = None) -> bytes:
    """The JUnit document for a verdict (UTF-8, with an XML declaration). `notes`: what failed beside
    the verdict (a canary's drift from its baseline, a server lost mid-run), each its own failing case."""
    suites = [("kvprobe", {}, [("run", ("run_note", note)) for note in notes])] if notes else []
    for name, d in v["decisions"].items():
        properties = {"decision": d.get("decision"), "reference": v.get("reference"),
                      "knob": knob_of(v),
                      "capacity_ratio": d.get("capacity_ratio"), "run": (v.get("run") or {}).get("id")}
        suites.append((f"kvprobe.{name}", properties, _candidate_cases(v, name)))
    return _document(suites)
