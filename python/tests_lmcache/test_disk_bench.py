"""bench/disk_vs_lmcache.py against the real LMCache 0.5.6 LocalDiskBackend, on a tiny workload:
it runs every side (hsstore's disk tier, LMCache's backend with and without O_DIRECT, the raw
reference), its own checks pass (both sides read back bit-exact what they wrote, hsstore's stats
count every value written and read by the disk tier: it exits non-zero otherwise), its report
holds every figure, and it leaves nothing behind. The figures themselves are docs/perf.md's."""

import json
import os
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "disk_vs_lmcache.py"


def test_disk_bench_runs_both_sides_and_checks_their_values(tmp_path):
    report_path = tmp_path / "report.json"
    work = tmp_path / "work"
    work.mkdir()
    run = subprocess.run(
        [sys.executable, str(BENCH), "--tokens", "1024", "--hidden", "256", "--rounds", "2",
         "--reps", "1", "--dir", str(work), "--json", str(report_path)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, HSS_LOG_LEVEL="warn"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["bytes"] == 1024 * 256 * 4 and len(report["rounds"]) == 2
    assert not report["failures"], report["failures"]
    have = {(row["figure"], row["side"]) for row in report["figures"]}
    for side in ("hsstore", "lmcache", "lmcache O_DIRECT"):
        assert ("spill", side) in have and ("cold read", side) in have, side
    assert ("spill", "raw") in have and ("cold read", "raw") in have
    for row in report["figures"]:
        assert all(seconds > 0 for seconds in row["seconds"]), row
        if row["side"].startswith("lmcache") and row["figure"] != "open":
            assert len(row["lmcache_over_hsstore"]) == 2, row  # one ratio per round
    assert report["hsstore"]["read_mode"], report["hsstore"]
    assert report["lmcache"]["O_DIRECT"]["use_odirect"] is True
    assert report["lmcache"]["default"]["use_odirect"] is False
    assert list(work.iterdir()) == []  # the bench's directory is gone
