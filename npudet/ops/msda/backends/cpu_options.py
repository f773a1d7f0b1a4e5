"""The CPU kernel's design choices as one typed, validated option set.

Each field is a compile-time template parameter of ``ops/msda_cpu/msda_cpu.cpp`` (the hot loops
carry no branch on it); ``as_ints()`` is what the custom ops pass to the kernel, which
parses it into its ``KernelOptions`` struct and checks it again.

``backward`` (how grad_value is written without contention):
    ``auto``   private copies: each thread writes grad_value directly except in the one batch
               entry it may share with the previous thread, accumulated in a private copy of
               that entry (at most threads - 1 copies of K*NH*D); when those copies would
               exceed ``private_budget_bytes``, ownership instead;
    ``owner``  work partitioned by (batch, head) so every grad_value slice has one writer;
               with fewer pairs than threads, queries are split into chunks, each chunk but
               the first writing a private copy of grad_value; the number of chunks is cut
               so that these copies stay within ``private_budget_bytes`` too (0: no copy);
    ``atomic`` work in parallel over queries (or head blocks), atomic adds into grad_value.
``fused_corners``: the four corners of a sample in one pass over the channels (else one
pass per corner). ``prefetch``: software prefetch of the planned corner rows and of the
per-row inputs. ``order``: ``query`` (all heads of a query in turn) or ``head`` (a block of
64 queries of one head per work item; the ownership backward always walks one
(batch, head) pair's queries, so for it ``order`` only changes the forward).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional

BACKWARDS = ("auto", "owner", "atomic")
ORDERS = ("query", "head")
# The default bound on the backward's private grad_value copies (the kernel's default too).
DEFAULT_PRIVATE_BUDGET_BYTES = 1 << 28


@dataclass(frozen=True)
class CPUKernelOptions:
    """One configuration of the fused CPU kernel; the defaults are ``impl="cpu"``'s.

    ``private_budget_bytes`` bounds the extra memory of the private grad_value copies
    (``auto`` and ``owner``; None: 256 MiB). A small value forces ``auto`` onto the
    ownership strategy whenever a copy would be needed.
    """

    backward: str = "auto"
    fused_corners: bool = True
    prefetch: bool = True
    order: str = "query"
    private_budget_bytes: Optional[int] = None

    def __post_init__(self) -> None:
        for name, allowed in (("backward", BACKWARDS), ("order", ORDERS)):
            got = getattr(self, name)
            if got not in allowed:
                raise ValueError(f"CPUKernelOptions.{name}: expected one of {allowed}, got {got!r}")
        for name in ("fused_corners", "prefetch"):
            got = getattr(self, name)
            if not isinstance(got, bool):
                raise TypeError(f"CPUKernelOptions.{name}: expected a bool, got {got!r}")
        budget = self.private_budget_bytes
        if budget is not None:
            if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
                raise TypeError(
                    f"CPUKernelOptions.private_budget_bytes: expected None or an int >= 0, "
                    f"got {budget!r}"
                )
            if self.backward == "atomic":
                raise ValueError(
                    "CPUKernelOptions: private_budget_bytes bounds the private copies of "
                    "backward='auto' and 'owner'; backward='atomic' makes none"
                )

    def as_ints(self) -> List[int]:
        """[backward, fused, prefetch, head_major, private_budget_bytes]: the kernel's
        ``KernelOptions`` in the order ``parse_options`` reads them."""
        budget = self.private_budget_bytes
        return [
            BACKWARDS.index(self.backward),
            int(self.fused_corners),
            int(self.prefetch),
            int(self.order == "head"),
            DEFAULT_PRIVATE_BUDGET_BYTES if budget is None else budget,
        ]

    def differences(self, other: CPUKernelOptions) -> List[str]:
        """Names of the fields whose values differ from ``other``'s."""
        return [
            f.name
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]
