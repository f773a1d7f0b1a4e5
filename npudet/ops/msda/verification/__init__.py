"""Whether an implementation can be trusted: the parity engine (``parity``), recorded
verifications (``records``) and the device they were made on (``device_identity``), which
``auto`` reads at run time."""
