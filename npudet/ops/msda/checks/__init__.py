"""Whether an implementation can be trusted: the parity engine (``parity``), recorded
verifications (``records``), the compile checks of the Triton kernels (``kernel_compile``,
``ascend_lowering``) and the CPU kernel's row-load probe (``cpu_probe``)."""
