"""``--msda-impl`` and ``--msda-layers`` of tools/train.py and tools/test.py: each sets its own
keys of ``model.msda`` and keeps the other's; a bad layers value stops the preflight."""

from __future__ import annotations

import pytest
from plugin_util import SMALL_DETR

from npudet.engine.cli import config_parser, load_config
from npudet.engine.preflight import PreflightError, check_msda


def _config(*flags: str):
    args = config_parser("test", "config").parse_args([SMALL_DETR, "--work-dir", "w", *flags])
    return load_config(args)


def test_flags_set_their_own_keys(monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")  # load_config sets it when absent; left as it was
    cfg = _config("--msda-layers", "ffn+dropout")
    assert cfg.model.msda == dict(impl="auto", encoder=None, decoder=None, layers="ffn+dropout")
    cfg = _config("--msda-impl", "cpu", "--cfg-options", "model.msda.layers=stock")
    assert cfg.model.msda == dict(impl="cpu", encoder=None, decoder=None, layers="stock")
    cfg = _config("--msda-layers", "gelu")
    with pytest.raises(PreflightError, match=r"^model\.msda\.layers: expected 'fast', 'stock'"):
        check_msda(cfg, "cpu")
