"""Generate the built-in synthetic multi-camera BEV set (images/ + infos_{train,val}.json)."""

from __future__ import annotations

import argparse
import time

from npudet.bev.infos import synthetic as bev


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default="data/bev_synth", help="output folder")
    parser.add_argument("--num-train-scenes", type=int, default=bev.NUM_SCENES_TRAIN)
    parser.add_argument("--num-val-scenes", type=int, default=bev.NUM_SCENES_VAL)
    parser.add_argument(
        "--frames", type=int, default=bev.FRAMES_PER_SCENE, help="frames per scene (0.5 s apart)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--width", type=int, default=bev.WIDTH, help="camera image width in pixels")
    parser.add_argument(
        "--height", type=int, default=bev.HEIGHT, help="camera image height in pixels"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="processes rendering scenes (same files as 1)"
    )
    parser.add_argument("--force", action="store_true", help="regenerate even if up to date")
    args = parser.parse_args()
    start = time.time()
    paths = bev.make_bev_dataset(
        args.root,
        args.num_train_scenes,
        args.num_val_scenes,
        args.frames,
        args.seed,
        args.width,
        args.height,
        force=args.force,
        workers=args.workers,
    )
    state = f"written in {time.time() - start:.1f} s" if paths["written"] else "already present"
    print(
        f"[bev_synth] {args.root}: {args.num_train_scenes} train / {args.num_val_scenes} val "
        f"scenes x {args.frames} frames x 6 cameras ({args.width}x{args.height}), {state}"
    )


if __name__ == "__main__":
    main()
