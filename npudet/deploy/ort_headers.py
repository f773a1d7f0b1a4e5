"""ONNX Runtime's C/C++ API headers, which the ``onnxruntime`` wheel does not ship.

They come from Debian's ``libonnxruntime-dev`` 1.21.0 package (85 KB): fetched once, its
checksum verified, and its ``usr/include/onnxruntime/`` unpacked into the extension cache
(``native_build.cache_root()``). A ``.deb`` is an ``ar`` archive around a ``data.tar.*``;
both are read here, so no ``dpkg`` is needed. ``NPUDET_ORT_HEADERS=<dir>`` names headers a
user already has (a folder holding ``onnxruntime_cxx_api.h``) and nothing is fetched.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Dict

from npudet.ops.msda.kernels import native_build

URL = (
    "http://deb.debian.org/debian/pool/main/o/onnxruntime/"
    "libonnxruntime-dev_1.21.0+dfsg-1_amd64.deb"
)
SHA256 = "14f7d959d5deacbcf1504830d4189f91fc67382b399ed9ae9d3aa9c4050ced08"
VERSION = "1.21.0"
ENV = "NPUDET_ORT_HEADERS"
MARKER = "onnxruntime_cxx_api.h"  # a folder of ORT headers has this file
_PREFIX = "usr/include/onnxruntime/"


def ar_members(data: bytes) -> Dict[str, bytes]:
    """The members of an ``ar`` archive (a ``.deb``) by name; ValueError if it is not one."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not an ar archive (no '!<arch>' magic)")
    members, offset = {}, 8
    while offset + 60 <= len(data):
        header = data[offset : offset + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        start = offset + 60
        members[name] = data[start : start + size]
        offset = start + size + (size % 2)  # members are 2-byte aligned
    return members


def unpack_headers(deb: bytes, out: Path) -> Path:
    """Unpack ``usr/include/onnxruntime/`` of package ``deb`` into ``out``; returns ``out``."""
    data = next((v for k, v in ar_members(deb).items() if k.startswith("data.tar")), None)
    if data is None:
        raise ValueError("the package has no data.tar member")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix("./")
            if member.isfile() and name.startswith(_PREFIX):
                target = out / name[len(_PREFIX) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    if not (out / MARKER).is_file():
        raise ValueError(f"the package holds no {_PREFIX}{MARKER}")
    return out


def _download(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except OSError as exc:
        raise RuntimeError(
            f"fetching ONNX Runtime's headers from {url} failed ({exc}); download it by hand "
            f"and unpack its usr/include/onnxruntime/, then set {ENV} to that folder"
        ) from None


def headers_dir(timeout: float = 120.0) -> Path:
    """The folder of ORT's headers: ``$NPUDET_ORT_HEADERS``, else the cache's copy, fetched
    and verified on first use. RuntimeError naming the URL or the variable when that fails."""
    given = os.environ.get(ENV)
    if given:
        folder = Path(given)
        if not (folder / MARKER).is_file():
            raise RuntimeError(f"{ENV}={given!r}: expected a folder holding {MARKER}")
        return folder
    folder = native_build.cache_root() / f"onnxruntime-headers-{VERSION}"
    if (folder / MARKER).is_file():
        return folder
    deb = _download(URL, timeout)
    digest = hashlib.sha256(deb).hexdigest()
    if digest != SHA256:
        raise RuntimeError(f"{URL}: sha256 {digest}, expected {SHA256}; not unpacked")
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Unpack beside, then rename: a concurrent fetch or one cut short never leaves a
    # partial folder under the final name.
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        unpacked = unpack_headers(deb, Path(tmp) / "include")
        try:
            unpacked.rename(folder)
        except OSError:  # another process got there first
            if not (folder / MARKER).is_file():
                raise
    return folder
