"""CPU tier: the results reference is what ``python -m bench report`` renders from the raw files.

Failure modes guarded: ``docs/results.md``, or the result block of ``README.md`` or
``docs/upstream_pr.md``, edited by hand or left behind after a raw file in ``docs/runs/`` changed
(rerun ``python -m bench report``); ``--check`` passing whatever the raw files say; a raw result
file kept in ``docs/runs/`` that no rendered table reads.
"""

import json
import os
import shutil

from bench import mutation_table, report

ROOT = report.ROOT


def test_committed_files_equal_what_the_renderer_produces():
    stale = []
    for path, text in report.render_all(ROOT).items():
        with open(os.path.join(ROOT, path)) as f:
            if f.read() != text:
                stale.append(path)
    assert not stale, f"{stale} differ from the raw results: run `python -m bench report`"
    assert report.main(["--check"]) == 0


def _copy_inputs(dst):
    with open(os.path.join(ROOT, report.MANIFEST)) as f:
        manifest = json.load(f)
    names = {n for t in manifest["tables"] for n in t["files"]}
    os.makedirs(os.path.join(dst, "docs", "runs"))
    for rel in [report.MANIFEST, report.RESULTS, *report.BLOCKS] + [os.path.join("docs", "runs", n) for n in names]:
        shutil.copy(os.path.join(ROOT, rel), os.path.join(dst, rel))
    shutil.copy(os.path.join(ROOT, mutation_table.DOC), os.path.join(dst, mutation_table.DOC))
    shutil.copytree(os.path.join(ROOT, mutation_table.RAW_DIR), os.path.join(dst, mutation_table.RAW_DIR))


def test_check_fails_when_a_raw_number_changes(tmp_path, capsys):
    _copy_inputs(tmp_path)
    assert report.main(["--root", str(tmp_path)]) == 0  # in line with the copied raw files
    assert report.main(["--check", "--root", str(tmp_path)]) == 0
    raw = tmp_path / "docs" / "runs" / "bench_llama8b_steps3_sweep.json"
    data = json.loads(raw.read_text())
    data["rows"][0]["ours_verify_ms"] *= 1.1  # one verify time 10% slower
    raw.write_text(json.dumps(data))
    capsys.readouterr()
    assert report.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "docs/results.md" in err[0] and "README.md" in err[0]
    assert report.main(["--root", str(tmp_path)]) == 0  # rendering brings them back in line
    assert report.main(["--check", "--root", str(tmp_path)]) == 0
    assert "| 1k | 1 | 5.176 | 1.41 | **1.04** |" in (tmp_path / "docs" / "results.md").read_text()


def test_every_raw_result_file_is_rendered():
    with open(os.path.join(ROOT, report.MANIFEST)) as f:
        listed = {n for t in json.load(f)["tables"] for n in t["files"]}
    runs = os.path.join(ROOT, "docs", "runs")
    present = {n for n in os.listdir(runs) if os.path.isfile(os.path.join(runs, n))} - {"manifest.json"}
    assert present == listed, f"in docs/runs/ but no table: {sorted(present - listed)}; missing: {sorted(listed - present)}"


def test_the_command_of_a_raw_file_drops_the_runner_local_arguments():
    cmd = ("/opt/venv/bin/python3 benchmark/bench_speedup.py --out /tmp/x.json --md /tmp/t.md --log-dir /tmp/l "
           "--pair-dir /tmp/m --mode-timeout 140 --modes plain --engine-extra '{\"a\":32}'")
    assert report.gpu_job_command(cmd, "speedup") == (
        'SUITE=speedup SPEEDUP_ARGS="--modes plain --engine-extra \'{\\"a\\":32}\'" bash scripts/gpu_job.sh')
    assert report.gpu_job_command("python3 bench/verify.py --out o.json", "verify") == "SUITE=bench bash scripts/gpu_job.sh"
