"""The GPU kit: a prepared run for a short-lived, offline GPU machine (``npudet_dev.gpu_kit``).

    python dev/tools/gpu_kit.py bundle       # here, once: mmcv's MSDA sources -> .gpu_kit/
    python dev/tools/gpu_kit.py size         # what a device run carries, against 64 MiB
    PYTHONPATH=.:dev python3 dev/tools/gpu_kit.py run --out "$OUT"   # the GPU machine (<= 9 min)
    python dev/tools/gpu_kit.py run --device cpu --dry-run --out /tmp/kit   # small shapes
    python dev/tools/gpu_kit.py build --build-dir B --arch 90 --compile-only   # nvcc, no GPU
    python dev/tools/gpu_kit.py build --build-dir B --arch 90 --torch-root T/torch  # + link, vs T

``run`` writes ``<gpu>.json``, ``<gpu>.md``, ``<gpu>.log`` and ``<gpu>-check_device.json``
under ``--out`` (default ``results/device``). Where nothing is installed (the GPU machine),
``PYTHONPATH=.:dev`` finds npudet and npudet_dev in the checkout.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional

from npudet.ops.msda.backends import mmcv_cuda_lib
from npudet_dev.gpu_kit import child
from npudet_dev.gpu_kit.run import CARRY_LIMIT, run_kit, travel_bytes

ROOT = Path(__file__).resolve().parents[2]

BUNDLE = ROOT / ".gpu_kit"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    bundle = sub.add_parser("bundle", help="mmcv's sdist (pip download) -> .gpu_kit/mmcv_msda")
    bundle.add_argument("--sdist", type=Path, default=None, help="a local mmcv-2.1.0.tar.gz")
    sub.add_parser("size", help="bytes a device run carries, against the 64 MiB limit")
    run = sub.add_parser("run", help="the kit: device check, benchmarks, training, compile")
    run.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    run.add_argument("--out", type=Path, default=ROOT / "results" / "device")
    run.add_argument("--dry-run", action="store_true", help="small shapes, one round")
    run.add_argument("--budget-s", type=float, default=None, help="default 540 (dry run 300)")
    build = sub.add_parser("build", help="mmcv's CUDA library from the bundle (nvcc)")
    build.add_argument("--build-dir", type=Path, required=True)
    build.add_argument("--arch", default=None, help='e.g. "90" (default: CUDA device 0\'s)')
    build.add_argument("--compile-only", action="store_true", help="objects only, no link")
    build.add_argument(
        "--torch-root",
        type=Path,
        default=None,
        help="build against this torch folder (an unpacked wheel), not the running torch",
    )
    args = parser.parse_args(argv)
    if args.command == "bundle":
        folder = mmcv_cuda_lib.make_bundle(BUNDLE, args.sdist)
        print(f"{folder.relative_to(ROOT)}: {mmcv_cuda_lib.folder_bytes(folder)} bytes")
        args.command = "size"
    if args.command == "size":
        carried = travel_bytes([BUNDLE / mmcv_cuda_lib.BUNDLE_DIR])
        print(f"a device run carries {carried / 2**20:.2f} MiB of {CARRY_LIMIT / 2**20:.0f} MiB")
        return 0 if carried < CARRY_LIMIT else 1
    if args.command == "build":
        sources = BUNDLE / mmcv_cuda_lib.BUNDLE_DIR
        cmd = ["build", "--json", str(args.build_dir / "build.json"), "--sources", str(sources)]
        cmd += ["--build-dir", str(args.build_dir)] + (["--arch", args.arch] if args.arch else [])
        cmd += ["--torch-root", str(args.torch_root)] if args.torch_root else []
        args.build_dir.mkdir(parents=True, exist_ok=True)
        code = child.main(cmd + (["--compile-only"] if args.compile_only else []))
        print((args.build_dir / "build.json").read_text())
        return code
    report = run_kit(args.device, args.out, args.dry_run, args.budget_s)
    print(f"wrote {args.out}/{report['gpu']} report ({report['seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
