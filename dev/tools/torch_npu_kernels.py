"""The aten ops torch_npu registers NPU (PrivateUse1) kernels for, read from a torch_npu wheel.

    python dev/tools/torch_npu_kernels.py torch_npu-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl

writes ``ops/npu_sim/python/torch_npu/_simulation/npu_kernels.txt`` (``--out`` to change), the
list the simulated NPU checks each op against: an op outside it runs through torch_npu's CPU
fallback on a real NPU (a warning, and a copy of its inputs to the host and back).

The source is the wheel's ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``: the
table torch_npu's build generates its ``RegisterNPU`` code from, torch_npu's own
``npu_native_functions.yaml`` merged with op_plugin's ``op_plugin_functions.yaml`` for this
torch release (``torchnpugen/gen_op_plugin_functions.py``; op_plugin's own yaml is not in the
wheel). Sections ``supported``, ``symint``, ``quant`` and ``autograd`` name aten ops; ops of
the ``custom`` section (torch_npu's ``npu::`` namespace) are left out. Kernels written by hand
outside the table cannot be read from the wheel with certainty (the library's strings hold op
names, but not the dispatch key they were registered under), so they are not in the list.
"""

from __future__ import annotations

import argparse
import re
import zipfile
from pathlib import Path
from typing import Iterable, List, Set

import yaml

TABLE = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
SECTIONS = ("supported", "symint", "quant", "autograd")
OUT = (
    Path(__file__).resolve().parents[2] / "ops/npu_sim/python/torch_npu/_simulation/npu_kernels.txt"
)
PROVENANCE = re.compile(r"^# torch_npu (\S+) \((\S+\.whl)\): " + re.escape(TABLE) + r", sections ")


def provenance(version: str, wheel: str) -> str:
    """The list's first line: torch_npu's version, the wheel's file name and the table read."""
    return f"# torch_npu {version} ({wheel}): {TABLE}, sections {', '.join(SECTIONS)}"


def _name(entry: object) -> str:
    """``add.Tensor`` from ``"add.Tensor"`` or ``{"func": "add.Tensor(Tensor self, ...)"}``."""
    func = entry if isinstance(entry, str) else entry["func"]
    return func.split("(", 1)[0].strip()


def aten_ops(table: dict) -> List[str]:
    """``aten::name.overload`` of every op the table gives an NPU kernel, sorted."""
    custom: Set[str] = {_name(e) for e in table.get("custom") or []}
    names: Iterable[str] = (_name(e) for s in SECTIONS for e in table.get(s) or [])
    return sorted({f"aten::{n}" for n in names if n not in custom})


def _version(wheel: zipfile.ZipFile) -> str:
    for member in wheel.namelist():
        if member.endswith(".dist-info/METADATA"):
            for line in wheel.read(member).decode().splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    raise ValueError("wheel: no .dist-info/METADATA with a Version line")


def write(wheel_path: Path, out: Path) -> int:
    """Write the list for ``wheel_path`` to ``out``; returns the number of ops."""
    with zipfile.ZipFile(wheel_path) as wheel:
        if TABLE not in wheel.namelist():
            raise ValueError(f"wheel: {wheel_path.name} holds no {TABLE} (a torch_npu wheel?)")
        table = yaml.safe_load(wheel.read(TABLE))
        version = _version(wheel)
    ops = aten_ops(table)
    out.write_text("\n".join([provenance(version, wheel_path.name), *ops]) + "\n")
    return len(ops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path, help="a torch_npu .whl")
    parser.add_argument("--out", type=Path, default=OUT, help=f"default: {OUT.name}")
    args = parser.parse_args()
    if not args.wheel.is_file():
        parser.error(f"wheel: no file {args.wheel}")
    count = write(args.wheel, args.out)
    print(f"{count} aten ops with an NPU kernel -> {args.out}")


if __name__ == "__main__":
    main()
