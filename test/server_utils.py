"""The tests' server harness: ``bench.lib.server`` (the lab's one harness), re-exported under the
name the GPU, server and multi-GPU tests import (``from server_utils import launch_server``)."""

import subprocess  # noqa: F401  (tests stub server_utils.subprocess.Popen: the module bench.lib.server uses)

from bench.lib.server import (  # noqa: F401
    ACCEPT_PAIR_ARGS,
    SHARED_GPU_ENV,
    SHARED_GPU_MEM_FRACTION,
    STOP_GRACE_ENV,
    ServerStartError,
    free_port,
    generate,
    launch_server,
    plugin_state,
    rank_disagreement,
    shared_gpu_args,
    shared_gpu_kwargs,
    stop_server,
    verify_graph_states,
    verify_graph_tp_states,
)
