"""memcheck --junit FILE: the result as JUnit XML that CI systems read -- a test case per check
(per variant with --self-test), failures carrying the anomalies' one-line explanations. Each
document is checked against the Ant/Jenkins JUnit schema's rules by parsing it."""

from __future__ import annotations

import re
from xml.etree import ElementTree

import pytest
from django.core.management import CommandError, call_command

from agentmemory.consistency.checker import CHECKS
from agentmemory.consistency.report import render_self_test_junit
from agentmemory.consistency.selftest import REAL, run_self_test
from agentmemory.consistency.workloads import WorkloadConfig
from agentmemory.defects import Defect

from .helpers import run_memcheck

pytestmark = pytest.mark.django_db(transaction=True)

#: The Jenkins JUnit schema (junit-10.xsd): required attributes, and what each element may hold.
SUITE_ATTRIBUTES = {"name", "tests", "failures", "errors", "time", "timestamp", "hostname"}
CASE_CHILDREN = {"skipped", "error", "failure", "system-out", "system-err"}


def valid_junit(text: str) -> ElementTree.Element:
    """The parsed document, after checking it follows the schema: testsuites of testsuite, each
    with its required attributes and counts that match its cases; properties first; each case
    named, classed and timed, holding at most one outcome."""
    root = ElementTree.fromstring(text.encode())
    assert root.tag == "testsuites"
    for suite in root:
        assert suite.tag == "testsuite" and set(suite.attrib) >= SUITE_ATTRIBUTES, suite.attrib
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", suite.get("timestamp"))
        float(suite.get("time"))
        children = list(suite)
        assert children[0].tag == "properties"
        assert all(p.tag == "property" and {"name", "value"} <= set(p.attrib) for p in children[0])
        cases = [c for c in children if c.tag == "testcase"]
        assert [c.tag for c in children[1:]] == ["testcase"] * len(cases)
        for case in cases:
            assert {"name", "classname", "time"} <= set(case.attrib)
            assert {child.tag for child in case} <= CASE_CHILDREN
            outcomes = [child for child in case if child.tag in {"skipped", "error", "failure"}]
            assert len(outcomes) <= 1
            for outcome in outcomes:
                assert outcome.tag == "skipped" or {"message", "type"} <= set(outcome.attrib)
        assert int(suite.get("tests")) == len(cases)
        for kind, attribute in (
            ("failure", "failures"),
            ("error", "errors"),
            ("skipped", "skipped"),
        ):
            assert int(suite.get(attribute, 0)) == sum(c.find(kind) is not None for c in cases)
    return root


def memcheck(*args: str) -> int:
    return run_memcheck(*args)[0]


def test_a_clean_run_is_one_passing_case_per_check(tmp_path):
    path = tmp_path / "memcheck.xml"
    assert memcheck("--ops", "200", "--faults", "none", "--junit", str(path)) == 0
    suite = valid_junit(path.read_text())[0]
    cases = suite.findall("testcase")
    assert [case.get("name") for case in cases] == list(CHECKS)
    assert suite.get("failures") == "0"
    assert {p.get("name") for p in suite.find("properties")} >= {"run_id", "database", "seed"}


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_a_run_with_anomalies_fails_their_checks_with_their_explanations(tmp_path):
    path = tmp_path / "memcheck.xml"
    assert memcheck("--ops", "600", "--unsafe", "--faults", "none", "--junit", str(path)) == 1
    suite = valid_junit(path.read_text())[0]
    failed = {
        case.get("name"): case.find("failure") for case in suite if case.find("failure") is not None
    }
    assert failed  # which checks catch the unlocked path varies with the backend's timing
    for check, failure in failed.items():
        assert re.match(r"\d+ anomalies: ", failure.get("message")), failure.get("message")
        assert f"[{check}] (" in failure.text


def test_the_self_test_is_one_case_per_variant_missed_ones_failing(settings):
    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": None}
    config = WorkloadConfig(ops=300, workloads=("register",))
    result = run_self_test(
        ["default"],
        config,
        faults="none",
        attempts=1,
        defects=[Defect.SKIPPED_VERSION, Defect.TTL_KEPT_ON_OVERWRITE, Defect.LOST_CACHE_UPDATE],
    )
    suite = valid_junit(render_self_test_junit(result))[0]
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert list(cases) == [REAL, "skipped-version", "ttl-kept-on-overwrite", "lost-cache-update"]
    assert cases[REAL].find("failure") is None
    assert "version-gap" in cases["skipped-version"].find("system-out").text
    assert cases["ttl-kept-on-overwrite"].find("failure").get("message") == "no check caught it"
    assert "no cache tier" in cases["lost-cache-update"].find("skipped").get("message")


def test_an_unwritable_junit_file_is_refused_before_the_run(tmp_path):
    with pytest.raises(CommandError, match="--junit"):
        call_command("memcheck", "--junit", str(tmp_path / "no" / "such" / "dir.xml"))
