"""BEVDataset: multi-camera samples from an ``npudet-bev-v1`` info file, with temporal queues."""

from __future__ import annotations

import copy
import os
import pickle
from typing import Any, Dict, List, Optional

import numpy as np
from mmdet.registry import DATASETS
from mmengine.dataset import BaseDataset

from ..infos.schema import load_bev_info


@DATASETS.register_module()
class BEVDataset(BaseDataset):
    """Multi-camera 3D detection samples (synthetic or converted nuScenes).

    ``get_data_info(i)`` returns the sample (``cams`` with absolute ``img_path``, ``ego2global``
    (4, 4), ``ego_pose_translation`` (3,), ``gt_boxes`` (N, 9) float64 (velocity NaN where
    unknown), ``gt_labels`` (N,) int64, ``gt_attrs`` list of N attribute names, ``cameras``) plus
    ``queue``:
    ``queue_length`` sample infos of the same scene, oldest first, current last. When the scene
    has fewer earlier frames the first one is repeated. ``prev_exists`` on every queue entry is
    True iff that frame has a real earlier frame in its scene (False for repeats and the scene's
    first frame). ``sample_idx`` is the index from the info file (the ``prev`` links use it).
    """

    def __init__(
        self,
        ann_file: str,
        data_root: str = "",
        pipeline: Optional[List[Any]] = None,
        queue_length: int = 2,
        test_mode: bool = False,
        filter_empty_gt: bool = False,
        metainfo: Optional[dict] = None,
        **kwargs: Any,
    ) -> None:
        if int(queue_length) < 1:
            raise ValueError(f"queue_length must be >= 1, got {queue_length}")
        self.queue_length = int(queue_length)
        self.filter_empty_gt = bool(filter_empty_gt)
        self._pos_of: Dict[int, int] = {}
        super().__init__(
            ann_file=ann_file,
            data_root=data_root,
            pipeline=pipeline if pipeline is not None else [],
            test_mode=test_mode,
            metainfo=metainfo,
            **kwargs,
        )

    def load_data_list(self) -> List[dict]:
        info = load_bev_info(self.ann_file)
        meta = info["metainfo"]
        given = self._metainfo.get("classes")
        if given is not None and tuple(given) != tuple(meta["classes"]):
            raise ValueError(
                f"metainfo classes {tuple(given)} differ from the classes {tuple(meta['classes'])} "
                f"of info file {self.ann_file}; labels index the file's classes"
            )
        self._metainfo["classes"] = tuple(meta["classes"])
        self._metainfo["cameras"] = tuple(meta["cameras"])
        for key in ("version", "source"):
            if key in meta:
                self._metainfo.setdefault(key, meta[key])
        return [self.parse_data_info(sample) for sample in info["data_list"]]

    def parse_data_info(self, raw: dict) -> dict:
        """Convert one validated info entry to numpy arrays and absolute image paths."""
        cams = {}
        for name in self._metainfo["cameras"]:
            cam = raw["cams"][name]
            cams[name] = dict(
                img_path=os.path.join(self.data_root, cam["img_path"]),
                cam2ego=np.asarray(cam["cam2ego"], np.float64),
                intrinsic=np.asarray(cam["intrinsic"], np.float64),
                width=int(cam["width"]),
                height=int(cam["height"]),
            )
        return dict(
            sample_idx=int(raw["sample_idx"]),
            token=str(raw["token"]),
            scene=str(raw["scene"]),
            frame=int(raw["frame"]),
            timestamp=float(raw["timestamp"]),
            prev=int(raw["prev"]),
            ego2global=np.asarray(raw["ego2global"], np.float64),
            ego_pose_translation=np.asarray(raw["ego_pose_translation"], np.float64),
            cams=cams,
            gt_boxes=np.asarray(raw["gt_boxes"], np.float64).reshape(-1, 9),
            gt_labels=np.asarray(raw["gt_labels"], np.int64).reshape(-1),
            gt_attrs=[str(a) for a in raw["gt_attrs"]],
        )

    def filter_data(self) -> List[dict]:
        if self.test_mode or not self.filter_empty_gt:
            return self.data_list
        return [d for d in self.data_list if len(d["gt_labels"]) > 0]

    def full_init(self) -> None:
        if self._fully_initialized:
            return
        super().full_init()
        self._pos_of = {self._raw_info(i)["sample_idx"]: i for i in range(len(self))}

    def _raw_info(self, pos: int) -> dict:
        if self.serialize_data:
            start = 0 if pos == 0 else self.data_address[pos - 1].item()
            end = self.data_address[pos].item()
            return pickle.loads(memoryview(self.data_bytes[start:end]))
        return copy.deepcopy(self.data_list[pos])

    def get_data_info(self, idx: int) -> dict:
        if not self._fully_initialized:
            self.full_init()
        pos = idx if idx >= 0 else len(self) + idx
        info = self._raw_info(pos)
        chain = [info]
        for _ in range(self.queue_length - 1):
            prev_pos = self._pos_of.get(chain[0]["prev"]) if chain[0]["prev"] >= 0 else None
            if prev_pos is None:
                break
            prev = self._raw_info(prev_pos)
            if prev["scene"] != info["scene"]:
                break
            chain.insert(0, prev)
        queue = []
        for item in chain:
            entry = dict(item)
            entry["prev_exists"] = bool(item["prev"] >= 0 and item["prev"] in self._pos_of)
            queue.append(entry)
        missing = self.queue_length - len(chain)
        pad = [dict(copy.deepcopy(chain[0]), prev_exists=False) for _ in range(missing)]
        queue = pad + queue
        result = dict(info)
        result["prev_exists"] = queue[-1]["prev_exists"]
        result["queue"] = queue
        result["cameras"] = list(self._metainfo["cameras"])
        return result
