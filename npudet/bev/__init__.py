"""BEVFormer-style multi-camera 3D detection on npudet's MSDA, as one vertical.

:mod:`.infos` is the BEV info-file format and what writes it (the synthetic set, the
nuScenes converter; numpy only, no mmdet); :mod:`.datasets` the dataset and transforms that
read it, :mod:`.models` the detector, :mod:`.evaluation` the nuScenes-style metric; the last
three register in mmdet's registries when imported (``npudet.plugin`` imports them).
"""
