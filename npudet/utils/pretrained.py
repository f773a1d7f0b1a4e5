"""Turning a config's pretrained-weight loading off (benchmarks and tests download nothing)."""

from __future__ import annotations

from typing import Any, List


def drop_pretrained(cfg: Any) -> List[str]:
    """Set every ``init_cfg`` of type ``Pretrained`` in ``cfg['model']`` (an mmengine
    ``Config`` or a dict) to None, keeping any other initialiser of a list, in place;
    returns where they were (dotted paths).

    The COCO and BEVFormer-tiny configs start their backbone from ``torchvision://resnet50``
    as mmdet's and BEVFormer's do; benchmarks and tests download nothing.
    """
    found: List[str] = []

    def walk(node: Any, path: str) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in list(items):
            where = f"{path}.{key}"
            if key == "init_cfg" and value is not None:
                cfgs = value if isinstance(value, list) else [value]
                kept = [c for c in cfgs if c.get("type") != "Pretrained"]
                if len(kept) < len(cfgs):
                    node[key] = kept if isinstance(value, list) and kept else None
                    found.append(where)
            elif isinstance(value, (dict, list)):
                walk(value, where)

    walk(cfg["model"], "model")
    return found
