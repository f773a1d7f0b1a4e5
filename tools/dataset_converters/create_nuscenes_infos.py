"""Convert a nuScenes dataroot into npudet-bev-v2 info files (infos_{train,val}.json).

    .venv/bin/python tools/dataset_converters/create_nuscenes_infos.py --dataroot data/nuscenes
        --version v1.0-mini

Needs nuscenes-devkit (extra 'nuscenes'; `bash tools/setup.sh` installs it).
"""

from __future__ import annotations

import argparse
import sys

from npudet.bev.infos.nuscenes import create_nuscenes_infos


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataroot", required=True, help="nuScenes root (holds v1.0-*/, samples/)")
    parser.add_argument("--version", default="v1.0-trainval", help="v1.0-trainval, -mini or -test")
    parser.add_argument(
        "--out-dir", default=None, help="where to write the infos (default: dataroot)"
    )
    parser.add_argument(
        "--min-points", type=int, default=1, help="drop boxes with fewer lidar+radar points"
    )
    args = parser.parse_args(argv)
    try:
        paths = create_nuscenes_infos(
            args.dataroot, args.version, args.out_dir, min_points=args.min_points, verbose=True
        )
    except (ImportError, FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
