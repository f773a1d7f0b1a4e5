"""Generate the built-in shapes COCO set (images + annotations/instances_{train,val}.json) and
its semantic maps (semantic/{train,val}/*.png) for the MMSegmentation config."""

from __future__ import annotations

import argparse
import time

from npudet.datasets import make_shapes_dataset, write_semantic_maps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default="data/shapes", help="output folder")
    parser.add_argument("--num-train", type=int, default=1000)
    parser.add_argument("--num-val", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", type=int, default=256, help="image side in pixels")
    parser.add_argument("--max-objects", type=int, default=4, help="objects per image, at most")
    args = parser.parse_args()
    start = time.time()
    wrote = make_shapes_dataset(
        args.root, args.num_train, args.num_val, args.seed, args.size, args.max_objects
    )
    wrote = write_semantic_maps(args.root) or wrote
    state = f"written in {time.time() - start:.1f} s" if wrote else "already present"
    print(f"[shapes] {args.root}: {args.num_train} train / {args.num_val} val images, {state}")


if __name__ == "__main__":
    main()
