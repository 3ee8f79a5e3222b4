"""CPU tier: the mutation table of ``docs/testing.md`` is rendered from the raw mutmut results in
``docs/runs/mutation/`` (``bench.mutation_table``, run by ``python -m bench report``).

Failure modes guarded: a count in the table edited by hand or left behind after a raw file
changed; a subpackage module (``debug.selftest``) or a method mutant (``xǁClassǁmethod``) counted
under the wrong module; timeouts or untested mutants counted as killed; a malformed raw line
skipped silently."""

import os

import pytest

from bench import mutation_table as mt

RAW = """\
# mutmut 3.8.1; SGLang 0.5.16
# commit abc123
    sglang_verify_graph.plan.x_verify_plan__mutmut_1: killed
    sglang_verify_graph.plan.x_verify_plan__mutmut_2: survived
    sglang_verify_graph.debug.selftest.xǁGraphSelfTestǁcompare__mutmut_3: killed
    sglang_verify_graph.debug.selftest.x_worst__mutmut_1: timeout
    sglang_verify_graph.debug.selftest.x_worst__mutmut_2: no tests
    sglang_verify_graph.debug.selftest.x_worst__mutmut_3: killed
"""


def _root(tmp_path, raw=RAW, doc="# Testing\n\n<!-- mutation:begin -->\nold\n<!-- mutation:end -->\n\ntail\n"):
    (tmp_path / "docs" / "runs" / "mutation").mkdir(parents=True)
    (tmp_path / "docs" / "runs" / "mutation" / "kernel_side.txt").write_text(raw, encoding="utf-8")
    (tmp_path / "docs" / "testing.md").write_text(doc, encoding="utf-8")
    return str(tmp_path)


def test_the_table_counts_each_module_and_status(tmp_path):
    block = mt.render(_root(tmp_path))
    assert "`docs/runs/mutation/kernel_side.txt`: mutmut 3.8.1; SGLang 0.5.16; commit abc123." in block
    assert "| `debug.selftest` | 2 + 1 timeout / 4 | no tests 1 | 75.0% |" in block
    assert "| `plan` | 1 / 2 | survived 1 | 50.0% |" in block
    assert "| **all** | 3 + 1 timeout / 6 | no tests 1, survived 1 | 66.7% |" in block
    assert block.index("`debug.selftest`") < block.index("`plan`")


def test_the_document_keeps_everything_outside_the_block(tmp_path):
    root = _root(tmp_path)
    text = mt.render_doc(root)[mt.DOC]
    assert text.startswith("# Testing\n\n<!-- mutation:begin -->\n\n`docs/runs/mutation/kernel_side.txt`")
    assert text.endswith("<!-- mutation:end -->\n\ntail\n") and "old" not in text


def test_a_changed_raw_status_changes_the_table(tmp_path):
    before = mt.render(_root(tmp_path))
    path = os.path.join(str(tmp_path), mt.RAW_DIR, "kernel_side.txt")
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(raw.replace("x_verify_plan__mutmut_2: survived", "x_verify_plan__mutmut_2: killed"))
    after = mt.render(str(tmp_path))
    assert after != before and "| `plan` | 2 / 2 | - | 100.0% |" in after


def test_a_malformed_line_is_one_error_naming_the_file_and_line(tmp_path):
    with pytest.raises(ValueError, match=r"^docs/runs/mutation/kernel_side.txt:4: not a mutmut result line"):
        mt.render(_root(tmp_path, raw=RAW.replace("x_verify_plan__mutmut_2: survived", "x_verify_plan: ?")))


def test_a_document_without_the_markers_is_refused(tmp_path):
    with pytest.raises(ValueError, match="needs one"):
        mt.render_doc(_root(tmp_path, doc="# Testing\n"))


def test_the_committed_table_is_the_rendering_of_the_committed_raw_files():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, mt.DOC), encoding="utf-8") as f:
        assert f.read() == mt.render_doc(root)[mt.DOC], "run `python -m bench report`"
