"""The project's training benchmarks, built on ``npudet.ablation``: real-size iterations against
stock mmdet + mmcv (:mod:`.iteration_bench`, ``dev/tools/bench_iteration.py``; its child
:mod:`.iteration_child`, configs :mod:`.bench_config`, data :mod:`.bench_data`, time split
:mod:`.time_split`, matching :mod:`.matching`, round-off control :mod:`.roundoff_control` and
report :mod:`.iteration_report`), the op profile of an iteration (:mod:`.op_profile`,
``dev/tools/profile_iteration.py``) and the BEV temporal ablation (:mod:`.bev_temporal`,
``dev/tools/bev_temporal_ablation.py``)."""
