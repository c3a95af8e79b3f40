"""memcheck --report DIR: the run as a page that opens from disk -- header, plots of throughput and
latency with the faults shaded, the checks, each anomaly with its operations -- and the history
beside it, which --check checks again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agentmemory.consistency.checker import CHECKS

from .helpers import run_memcheck

pytestmark = pytest.mark.django_db(transaction=True)

PNG = b"\x89PNG\r\n\x1a\n"


def memcheck(*args: str) -> int:
    return run_memcheck(*args)[0]


def assert_self_contained(folder: Path) -> str:
    """The page, after checking that everything it links is a file beside it (no network)."""
    page = (folder / "index.html").read_text()
    links = re.findall(r'(?:src|href)="([^"#]+)"', page)
    assert links, "the page links its plots and history"
    for link in links:
        assert "://" not in link and (folder / link).is_file(), link
    for plot in ("throughput.png", "latency.png"):
        assert (folder / plot).read_bytes().startswith(PNG)
        assert f'src="{plot}"' in page
    return page


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_a_report_shows_each_anomaly_with_its_operations(tmp_path):
    """An --unsafe run (which checks catch it varies with the backend's timing: lost updates,
    CAS violations, two pops of one log item...): each failed check links to its section, where
    each anomaly shown has its operations and its timeline."""
    folder = tmp_path / "report"
    assert memcheck("--ops", "600", "--unsafe", "--faults", "none", "--report", str(folder)) == 1
    page = assert_self_contained(folder)
    assert 'class="verdict fail"' in page and "anomalies</p>" in page
    for check in CHECKS:
        assert f'id="check-{check}"' in page
    failed = re.findall(r'href="#anomalies-([a-z-]+)" class="fail">FAIL', page)
    assert failed
    for check in failed:
        section = page.split(f'id="anomalies-{check}"', 1)[1].split('<h2 id="anomalies-', 1)[0]
        anomalies = section.split('<div class="anomaly">')[1:]
        assert anomalies
        for anomaly in anomalies:
            # One with operations shows them, and its timeline: the key's operations around
            # it (an anomaly of a whole log's state, such as its count, has no operation).
            if "<th>op</th>" in anomaly:
                timeline = re.search(r'<img src="(anomaly-[^"]+\.png)" class="timeline"', anomaly)
                assert timeline, anomaly[:300]
                assert (folder / timeline.group(1)).read_bytes().startswith(PNG)
    assert any("<th>op</th>" in part for part in page.split('<div class="anomaly">')[1:])
    assert memcheck("--check", str(folder / "history.jsonl")) == 1


@pytest.mark.slow  # memcheck runs with faults, self-test variants, processes: every backend in make test; not the matrix
def test_a_clean_run_with_faults_shows_their_windows(tmp_path):
    folder = tmp_path / "report"
    assert memcheck("--ops", "300", "--faults", "lock", "--report", str(folder)) == 0
    page = assert_self_contained(folder)
    assert 'class="verdict pass"' in page and "No anomaly" in page
    windows = page[page.index('id="fault-windows"') :]
    assert "<td>db-lock</td>" in windows
    assert 'id="anomalies-' not in page


def test_the_self_test_report_says_which_check_caught_each_variant(settings, tmp_path):
    from agentmemory.consistency.html import write_self_test_report
    from agentmemory.consistency.selftest import run_self_test
    from agentmemory.consistency.workloads import WorkloadConfig
    from agentmemory.defects import Defect

    settings.AGENTMEMORY = {**settings.AGENTMEMORY, "CACHE": None}
    result = run_self_test(
        ["default"],
        WorkloadConfig(ops=300, workloads=("register",)),
        faults="none",
        attempts=1,
        defects=[Defect.SKIPPED_VERSION, Defect.TTL_KEPT_ON_OVERWRITE, Defect.LOST_CACHE_UPDATE],
    )
    page = write_self_test_report(result, tmp_path / "self-test").read_text()
    rows = re.findall(r'<tr id="variant-\d+">(.*?)</tr>', page, re.DOTALL)
    assert len(rows) == 4 and "(the real store)" in rows[0] and ">pass<" in rows[0]
    assert "skipped-version" in rows[1] and ">caught<" in rows[1] and "version-gap" in rows[1]
    assert ">MISSED<" in rows[2] and ">n/a<" in rows[3] and "no cache tier" in rows[3]
    assert "Self-test FAILED" in page  # a variant slipped through


def test_a_cluster_run_plots_each_nodes_throughput(tmp_path):
    """On a cluster (the Galera and PostgreSQL HA suites: aliases default, node2, ...) each
    node's throughput is plotted too; on one server there is no such plot."""
    from django.db import connections

    from agentmemory.consistency.html import write_report
    from agentmemory.consistency.runner import run_memcheck
    from agentmemory.consistency.workloads import WorkloadConfig

    aliases = ["default", *[a for a in connections.settings if a.startswith("node")]]
    result = run_memcheck(aliases, WorkloadConfig(ops=200), faults="none")
    page = write_report(result, tmp_path / "report").read_text()
    assert ('src="nodes.png"' in page) == (len(aliases) > 1)
