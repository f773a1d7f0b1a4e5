"""Helpers about the machine npudet runs on (imports only torch)."""

from .device import (
    NPUSetting,
    current_device_type,
    device_name,
    npu_available,
    npu_training_settings,
)

__all__ = [
    "NPUSetting",
    "current_device_type",
    "device_name",
    "npu_available",
    "npu_training_settings",
]
