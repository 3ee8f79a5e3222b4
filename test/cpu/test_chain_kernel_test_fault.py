"""CPU tier: the chain kernel launcher's test fault switch (``SGLANG_VERIFY_GRAPH_TEST_FAULT``).

Unset, the launcher passes no ``FAULT`` constexpr (the build and launch of the kernel without the
switch); set, the verify role's stage 1 gets the fault's code and the draft-extend role's does
not; the value is read once per process; an unknown value is one line naming the variable and
the valid values. The kernels are replaced by recorders (what the faults compute is
``test_chain_kernel_interpret.py::test_test_fault_switch_in_interpreter``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sgl-kernel"))
torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from sglang_verify_graph.kernel import chain_verify_attention as cva  # noqa: E402


class _Recorder:
    """Stands in for a ``triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records kwargs."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(kwargs)


@pytest.fixture
def launch(monkeypatch):
    """``launch(env_value, include_chain)`` -> stage 1's keyword arguments of one launch."""

    def run(value, include_chain=False):
        if value is None:
            monkeypatch.delenv(cva.TEST_FAULT_ENV, raising=False)
        else:
            monkeypatch.setenv(cva.TEST_FAULT_ENV, value)
        monkeypatch.setattr(cva, "_TEST_FAULT", [])
        s1, s2 = _Recorder(), _Recorder()
        monkeypatch.setattr(cva, "_chain_verify_stage1", s1)
        monkeypatch.setattr(cva, "_chain_verify_stage2", s2)
        shape = cva.ChainVerifyShape(4, 2, 16, 16, 3)
        bs, ns = 2, 4
        n_out, n_lse = cva.workspace_numel(shape, bs, ns)
        k = torch.zeros(64, 2, 16)
        q = torch.zeros(bs * 3, 4, 16)
        cva.chain_verify_attention_fwd(
            q, k, k, torch.zeros_like(q), torch.zeros(4, 32, dtype=torch.int32),
            torch.zeros(bs, dtype=torch.int64), torch.tensor([5, 9]), shape, ns, 0.25,
            torch.empty(n_out), torch.empty(n_lse), seq_lens_include_chain=include_chain)
        assert len(s1.calls) == len(s2.calls) == 1
        return s1.calls[0]

    return run


def test_unset_passes_no_fault_constexpr(launch):
    shape = cva.ChainVerifyShape(4, 2, 16, 16, 3)
    for value in (None, "", "  "):
        cfg = launch(value)
        assert "FAULT" not in cfg
        assert cfg == cva.launch_config(shape)[0]  # exactly the launch without the switch


@pytest.mark.parametrize("name", sorted(cva.TEST_FAULTS))
def test_the_verify_role_gets_the_fault_and_draft_extend_does_not(launch, name):
    assert launch(name)["FAULT"] == cva.TEST_FAULTS[name] > 0
    assert "FAULT" not in launch(name, include_chain=True)


def test_the_switch_is_read_once(monkeypatch):
    monkeypatch.setattr(cva, "_TEST_FAULT", [])
    monkeypatch.setenv(cva.TEST_FAULT_ENV, "causal_plus_one")
    assert cva.read_test_fault() == cva.TEST_FAULTS["causal_plus_one"]
    monkeypatch.setenv(cva.TEST_FAULT_ENV, "drop_first_split")
    assert cva.read_test_fault() == cva.TEST_FAULTS["causal_plus_one"]


@pytest.mark.parametrize("include_chain", [False, True])
def test_an_unknown_value_is_one_line_naming_the_variable_and_the_values(launch, include_chain):
    with pytest.raises(ValueError) as e:
        launch("causal_plus_two", include_chain)
    msg = str(e.value)
    assert "\n" not in msg and cva.TEST_FAULT_ENV in msg and "'causal_plus_two'" in msg
    assert all(name in msg for name in cva.TEST_FAULTS), msg


def test_the_reference_refuses_an_unknown_fault():
    z = torch.zeros(3, 1, 4)
    with pytest.raises(ValueError, match="causal_plus_one"):
        cva.chain_verify_attention_ref(z, z, z, torch.zeros(1, 8, dtype=torch.int32),
                                       torch.zeros(1, dtype=torch.int64), torch.tensor([2]), 3, 1.0,
                                       fault="bogus")


def test_the_pair_simulator_uses_the_kernels_split_size():
    sys.path.insert(0, str(ROOT / "scripts"))
    import accept_pair

    assert accept_pair.MIN_KEYS_PER_SPLIT == cva.MIN_KEYS_PER_SPLIT
    assert set(accept_pair.FAULTS) == set(cva.TEST_FAULTS)
