"""``torch_npu.npu.config``: switches npudet's ``NPUSetupHook`` sets.

``allow_internal_format``: on a real NPU, whether operators may keep tensors in private
layouts (NC1HWC0, FRACTAL_NZ). The simulation has only the ND layout; the flag is kept so the
hook's action is observable.
"""

allow_internal_format = True
