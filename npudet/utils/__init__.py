"""Helpers about the machine npudet runs on (imports only torch)."""

from .device import current_device_type, device_name, npu_available

__all__ = ["current_device_type", "device_name", "npu_available"]
