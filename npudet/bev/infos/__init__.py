"""The BEV info files (:mod:`.schema`) and their writers: the synthetic multi-camera set
(:mod:`.synthetic`) and the nuScenes converter (:mod:`.nuscenes`); nuScenes attributes from
velocity (:mod:`.attributes`). numpy and OpenCV only: no mmdet import."""
