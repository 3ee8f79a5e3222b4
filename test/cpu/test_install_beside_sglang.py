"""``pip install`` of this project beside an installed SGLang keeps that SGLang and its torch.

A fresh environment holds ``sglang`` and ``torch`` as installed distributions (metadata only: the
versions a user's deployment pinned; their own requirements count as satisfied, as in a working
install). pip resolves this project's wheel there offline (``--dry-run --no-index``): beside a
supported release it installs this project and nothing else; beside a release outside the range it
finds no SGLang it may install, so nothing is changed either (the plugin then refuses with one line
only where it is asked for: ``test_plugin_wiring``).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True, text=True, timeout=300)
    (whl,) = out.glob("sglang_verify_graph-*.whl")
    return whl


def _environment(root: Path, installed: dict) -> Path:
    """A venv (no pip of its own) whose site-packages lists ``installed`` {name: version}."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    for name, version in installed.items():
        info = site / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    return python


def _dry_run(python: Path, wheel: Path, report: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run",
                           "--no-index", "--report", str(report), str(wheel)],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("release,torch", [("0.5.16", "2.11.0"), ("0.5.20", "2.13.0"), ("0.5.23", "2.14.1"),
                                           ("0.5.23.post1", "2.14.1")])
def test_beside_a_supported_release_only_this_project_is_installed(tmp_path, wheel, release, torch):
    python = _environment(tmp_path / "env", {"sglang": release, "torch": torch})
    proc = _dry_run(python, wheel, tmp_path / "report.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    install = json.loads((tmp_path / "report.json").read_text())["install"]
    assert [(i["metadata"]["name"], i["metadata"]["version"]) for i in install] == [
        ("sglang-verify-graph", "0.1.0")]


@pytest.mark.parametrize("release", ["0.5.15", "0.5.24"])
def test_beside_a_release_outside_the_range_pip_changes_nothing(tmp_path, wheel, release):
    python = _environment(tmp_path / "env", {"sglang": release, "torch": "2.14.1"})
    proc = _dry_run(python, wheel, tmp_path / "report.json")
    assert proc.returncode != 0
    assert "No matching distribution found for sglang" in proc.stderr, proc.stderr[-2000:]
