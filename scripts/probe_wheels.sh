#!/usr/bin/env bash
# Downloads what the device image lacks for scripts/gpu_probe.py into .whl/ (.gitignore), for
# Python 3.12 on x86-64, and prints what will travel. The image has torch 2.11 (CUDA 13) and
# transformers 5.17 but no network; pyproject asks for transformers 5.24 or later. Carried here:
# transformers and the huggingface_hub it needs (whose HTTP client, httpx2, pulls httpcore2,
# truststore, h11, idna and anyio at the versions it was run with here), and bitsandbytes for
# the 4-bit section, slimmed to its CUDA 13 library (the wheel holds one per CUDA and ROCm
# release, about 120 MB in all).
#
#   bash scripts/probe_wheels.sh          # PYTHON=/path/to/python chooses the pip that downloads
#
# Then, on the device machine, from the tree's root (carry: .whl):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
#   PYTHONUNBUFFERED=1 python3 scripts/gpu_probe.py
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
rm -rf .whl && mkdir -p .whl
WHEELS=(
  transformers==5.25.0 huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
  h11==0.16.0 idna==3.20 anyio==4.16.0 bitsandbytes==0.50.2
)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${WHEELS[@]}"
# bitsandbytes: keep the CUDA 13.0 library torch 2.11+cu130 loads, drop the other builds.
bnb=$(ls .whl/bitsandbytes-*.whl)
"$PY" - "$bnb" <<'PY'
import base64, hashlib, re, sys, zipfile
from pathlib import Path

path = Path(sys.argv[1])
keep = re.compile(r"libbitsandbytes_(cuda130|cpu)\.so$")
slim = path.with_suffix(".slim")
with zipfile.ZipFile(path) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
    names = [n for n in src.namelist() if not (n.endswith(".so") and "libbitsandbytes_" in n and not keep.search(n))]
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    rows = []
    for name in names:
        if name == record:
            continue
        data = src.read(name)
        dst.writestr(src.getinfo(name), data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(data)}")
    rows.append(f"{record},,")
    dst.writestr(record, "\n".join(rows) + "\n")
slim.replace(path)
PY
ls -la .whl
"$PY" scripts/gpu_probe.py --size
