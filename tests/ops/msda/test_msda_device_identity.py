"""``auto``'s trust decisions and records are per device model and capability, not per device type.

No second GPU here: the keying (``device_identity.identity``) is tested on descriptors of
devices this machine does not have, and ``auto`` on calls described for ``cuda:0`` and
``cuda:1`` whose identities come from those descriptors; the check that would run on a
device is replaced by one that notes which device it was asked about.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from msda_util import random_inputs

from npudet.ops.msda import MSDAInputs, auto, select_impl, validate_inputs
from npudet.ops.msda.verification import parity, records
from npudet.ops.msda.verification.device_identity import DeviceDescriptor, describe, identity
from npudet.ops.msda.verification.records import Record
from npudet.utils.device import device_name

H100 = DeviceDescriptor("cuda", "NVIDIA H100 80GB HBM3", "sm_90")
A100 = DeviceDescriptor("cuda", "NVIDIA A100-SXM4-80GB", "sm_80")


def test_two_gpu_models_have_two_keys_and_one_model_one():
    assert identity(H100) != identity(A100)
    assert identity(H100) == identity(DeviceDescriptor("cuda", "NVIDIA H100 80GB HBM3", "sm_90"))
    assert identity(H100) == "NVIDIA H100 80GB HBM3 (sm_90)"
    # Same marketing name, another capability (a MIG slice or a renamed part): another key.
    assert identity(H100) != identity(DeviceDescriptor("cuda", H100.name, "sm_89"))
    npu = DeviceDescriptor("npu", "Ascend910B3", "soc 222")
    assert identity(npu) == "Ascend910B3 (soc 222)"


def test_this_machines_devices_are_described():
    cpu = describe("cpu")
    # The CPU's key is its model; the cpu kernel's ISA variant is in each record's key.
    assert cpu == DeviceDescriptor("cpu", device_name("cpu")) and identity(cpu) == cpu.name
    assert records.current_device_name("cpu") == device_name("cpu")
    assert describe("meta") is None
    cuda = describe("cuda")
    if torch.cuda.is_available():
        assert cuda.capability.startswith("sm_") and cuda.name == torch.cuda.get_device_name()
    else:
        assert cuda is None and records.current_device_name("cuda", 1) is None


def test_inputs_carry_their_device_index():
    inputs = validate_inputs(*random_inputs())
    assert inputs.device_index is None and inputs.device == "cpu"
    gpu = MSDAInputs("cuda", torch.float32, 2, 30, 8, 32, 2, 10, 4, True, device_index=1)
    assert gpu.device == "cuda:1"


@pytest.fixture
def two_gpus(monkeypatch, tmp_path):
    """``cuda:0`` and ``cuda:1`` named by the descriptors in ``models`` (index -> descriptor);
    checks note the device they were asked about and fail, so only records can trust."""
    monkeypatch.setenv(records.VERIFY_FILE_ENV, str(tmp_path / "verified.json"))
    for name in ("_decisions", "_loaded", "_orders"):
        monkeypatch.setattr(auto, name, {})
    models = {0: H100, 1: A100}
    real = records.current_device_name

    def name(device_type, index=None):
        if device_type != "cuda":
            return real(device_type, index)
        return identity(models[0 if index is None else index])

    checked = []

    def check(impl, device, dtype):
        checked.append((impl, str(device)))
        return "output: checked here and wrong"

    monkeypatch.setattr(auto, "current_device_name", name)
    monkeypatch.setattr(parity, "check_impl", check)
    return models, checked


def test_a_record_for_one_gpu_model_is_not_trusted_for_another(two_gpus):
    models, checked = two_gpus
    records.save_records("cuda", identity(H100), [Record("gather", "float32", True)])
    assert auto.untrusted_reason("gather", "cuda:0", torch.float32) == ""
    assert checked == []  # the record of this model decided
    with pytest.warns(RuntimeWarning, match=r"skipping 'gather' on cuda \(NVIDIA A100.*sm_80\)"):
        assert auto.untrusted_reason("gather", "cuda:1", torch.float32) != ""
    assert checked == [("gather", "cuda:1")]  # checked on the inputs' own device
    call = MSDAInputs("cuda", torch.float32, 2, 30, 8, 32, 2, 10, 4, True, device_index=1)
    call0 = MSDAInputs("cuda", torch.float32, 2, 30, 8, 32, 2, 10, 4, True, device_index=0)
    with warnings.catch_warnings():  # the GPU kernels ahead of gather fail their checks here
        warnings.simplefilter("ignore", RuntimeWarning)
        assert select_impl("auto", call).NAME == "grid_sample"  # gather failed on cuda:1
        assert select_impl("auto", call0).NAME == "gather"
    keys = {k for k in auto._decisions if k[2] == "gather"}
    assert keys == {
        ("cuda", identity(H100), "gather", "float32"),
        ("cuda", identity(A100), "gather", "float32"),
    }


def test_two_gpus_of_one_model_share_one_trust_decision(two_gpus):
    models, checked = two_gpus
    models[1] = models[0]
    with pytest.warns(RuntimeWarning, match="skipping 'gather'"):
        auto.untrusted_reason("gather", "cuda:0", torch.float32)
    auto.untrusted_reason("gather", "cuda:1", torch.float32)
    assert checked == [("gather", "cuda:0")]  # one check for the model
    assert len([k for k in auto._decisions if k[2] == "gather"]) == 1


def test_records_of_two_models_are_two_entries(two_gpus, tmp_path):
    records.save_records("cuda", identity(H100), [Record("triton", "float32", True, "", 2.0)])
    records.save_records("cuda", identity(A100), [Record("triton", "float32", False, "off")])
    devices = records.load_records()["devices"]
    assert set(devices) == {f"cuda|{identity(H100)}", f"cuda|{identity(A100)}"}
    assert records.recorded("cuda", identity(H100), "triton", "float32").correct
    assert not records.recorded("cuda", identity(A100), "triton", "float32").correct
