"""The simulated NPU loaded in the test process (``npu_sim_util.simulated_npu``), a fixture
of this folder's tests only."""

from npu_sim_util import simulated_npu  # noqa: F401  (the fixture)
