"""CPU tier: the chain kernel's test fault, a launch argument (``fault=``) that the verify backend
passes from ``SGLANG_VERIFY_GRAPH_TEST_FAULT`` (parsed by ``env.read_env``).

Without a fault the launcher passes no ``FAULT`` constexpr (the build and launch of the kernel
without the switch); with one, stage 1 gets the fault's code; a fault on a draft-extend launch
(``seq_lens_include_chain``) or an unknown name is one ``ValueError`` line; an unknown value of the
variable is one line naming the variable and the valid values. The kernels are replaced by
recorders (what the faults compute is ``test_chain_kernel_interpret.py``)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
from sglang_verify_graph import env  # noqa: E402
from sglang_verify_graph.errors import VerifyGraphConfigError  # noqa: E402
from sglang_verify_graph.kernel import chain_verify_attention as cva  # noqa: E402


class _Recorder:
    """Stands in for a ``triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records kwargs."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append(kwargs)


@pytest.fixture
def launch(monkeypatch):
    """``launch(fault, include_chain)`` -> stage 1's keyword arguments of one launch."""

    def run(fault, include_chain=False):
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
            torch.empty(n_out), torch.empty(n_lse), seq_lens_include_chain=include_chain, fault=fault)
        assert len(s1.calls) == len(s2.calls) == 1
        return s1.calls[0]

    return run


def test_no_fault_passes_no_fault_constexpr(launch):
    shape = cva.ChainVerifyShape(4, 2, 16, 16, 3)
    cfg = launch(None)
    assert "FAULT" not in cfg
    assert cfg == cva.launch_config(shape)[0]  # exactly the launch without the switch
    assert "FAULT" not in launch(None, include_chain=True)


@pytest.mark.parametrize("name", sorted(cva.TEST_FAULTS))
def test_a_fault_reaches_stage_one(launch, name):
    assert launch(name)["FAULT"] == cva.TEST_FAULTS[name] > 0


@pytest.mark.parametrize("name", sorted(cva.TEST_FAULTS))
def test_a_fault_on_a_draft_extend_launch_is_refused(launch, name):
    with pytest.raises(ValueError, match="verify launch only"):
        launch(name, include_chain=True)


def test_an_unknown_fault_is_one_line_naming_the_faults(launch):
    with pytest.raises(ValueError) as e:
        launch("causal_plus_two")
    msg = str(e.value)
    assert "\n" not in msg and "'causal_plus_two'" in msg
    assert all(name in msg for name in cva.TEST_FAULTS), msg


def test_the_variable_names_the_kernels_faults():
    assert set(env.TEST_FAULT_CHOICES) == set(cva.TEST_FAULTS)
    for name in cva.TEST_FAULTS:
        assert env.read_env({env.ENV_TEST_FAULT: f" {name} "}).test_fault == name
    for unset in ({}, {env.ENV_TEST_FAULT: ""}, {env.ENV_TEST_FAULT: "  "}):
        assert env.read_env(unset).test_fault is None


def test_an_unknown_value_of_the_variable_is_one_line_naming_it_and_the_values():
    with pytest.raises(VerifyGraphConfigError) as e:
        env.read_env({env.ENV_TEST_FAULT: "causal_plus_two"})
    msg = str(e.value)
    assert "\n" not in msg and env.ENV_TEST_FAULT in msg and "'causal_plus_two'" in msg
    assert all(name in msg for name in cva.TEST_FAULTS), msg


def test_the_kernel_reads_no_environment():
    """The kernel modules never touch ``os.environ`` (the launch argument is the only switch)."""
    import inspect

    from sglang_verify_graph.kernel import triton_chain

    for mod in (cva, triton_chain):
        src = inspect.getsource(mod)
        assert "os.environ" not in src and "getenv" not in src, mod.__name__


def test_the_reference_refuses_an_unknown_fault():
    z = torch.zeros(3, 1, 4)
    with pytest.raises(ValueError, match="causal_plus_one"):
        cva.chain_verify_attention_ref(z, z, z, torch.zeros(1, 8, dtype=torch.int32),
                                       torch.zeros(1, dtype=torch.int64), torch.tensor([2]), 3, 1.0,
                                       fault="bogus")


def test_the_pair_simulator_uses_the_kernels_split_size():
    from bench.models import accept_pair

    assert accept_pair.MIN_KEYS_PER_SPLIT == cva.MIN_KEYS_PER_SPLIT
    assert set(accept_pair.FAULTS) == set(cva.TEST_FAULTS)
