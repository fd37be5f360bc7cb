"""The CSI plugin runs as a pod from the product image, which has no `cryptography` (the
control plane's certificates need it): importing it must not pull the control plane in."""

from __future__ import annotations

import subprocess
import sys


def test_csi_plugin_imports_without_the_control_planes_dependencies() -> None:
    code = (
        "import sys\n"
        "sys.modules['cryptography'] = None  # as in the image: not installed\n"
        "import devcluster.csi_hostpath\n"
        "assert 'devcluster.controlplane' not in sys.modules\n"
        "print('plugin imported')\n"
        "try:\n"
        "    from devcluster import ControlPlane\n"  # still there, on demand
        "except ModuleNotFoundError as exc:\n"
        "    print('control plane needs', exc.name)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["plugin imported", "control plane needs cryptography"]
